/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * The lists the protocol names, each written once: errors, dtypes, device
 * states, step results and the status counters. Every table, enum and parser
 * of these names (the core's, the kernel target's status line, libckpt's C
 * ABI, ckptctl and the Python package) is generated from these X-macros or
 * asks libckpt for them; nothing else spells them out.
 *
 * Plain C preprocessor text: included by the core (ckpt_codec.h), by the
 * kernel target and by libckpt's public header ckpt.h. It declares no types
 * of its own beyond the enums, so it needs no platform header.
 *
 * The values are ABI (they cross the control block and the C ABI): append
 * only, never reorder.
 */
#ifndef CKPT_ABI_H
#define CKPT_ABI_H

/*
 * X(NAME, message, errno): enum ckpt_err, numbered from 0 in this order,
 * returned negated by the core and by libckpt. The message is
 * ckpt_strerror()'s; errno is what a host that speaks errno (the kernel
 * target's messages and bios) answers for it, ckpt_err_errno().
 */
#define CKPT_ERRORS(X)							\
	X(OK,		"success", 0)					\
	X(E_INVAL,	"invalid argument", EINVAL)			\
	X(E_MAGIC,	"bad magic number", EINVAL)			\
	X(E_CRC,	"checksum mismatch", EINVAL)			\
	X(E_VERSION,	"unsupported version", EINVAL)			\
	X(E_FEATURE,	"unsupported feature bits", EINVAL)		\
	X(E_GEOMETRY,	"geometry out of range", EINVAL)		\
	X(E_LAYOUT,	"offsets or sizes disagree with the geometry", EINVAL)	\
	X(E_TOO_SMALL,	"device smaller than the layout", EINVAL)	\
	X(E_NO_SB,	"no valid superblock copy", EINVAL)		\
	X(E_OPCODE,	"unknown command", EINVAL)			\
	X(E_LENGTH,	"command length wrong", EINVAL)			\
	X(E_STEP,	"step number is not the expected one", EINVAL)	\
	X(E_STATE,	"not allowed in the current state", EINVAL)	\
	X(E_GROUPS,	"group count differs from the device's", EINVAL)	\
	X(E_HPARAM,	"hyperparameter not finite or out of range", EINVAL)	\
	X(E_TWICE,	"gradient written twice in one step", EINVAL)	\
	X(E_INCOMPLETE,	"commit with chunks not written", EINVAL)	\
	X(E_ALIGN,	"offset or length not sector aligned", EINVAL)	\
	X(E_RANGE,	"offset or length out of range", EINVAL)	\
	X(E_READONLY,	"region is read-only", EROFS)			\
	X(E_IO,		"backing device I/O error", EIO)		\
	X(E_NOSPC,	"staging memory exhausted", ENOSPC)		\
	X(E_FAILED,	"device failed earlier; no new steps", EIO)	\
	X(E_NAME,	"unknown tensor name", EINVAL)			\
	X(E_DTYPE,	"wrong dtype", EINVAL)				\
	X(E_SIZE,	"wrong number of elements", EINVAL)		\
	X(E_MANIFEST,	"corrupt or invalid tensor manifest", EINVAL)	\
	X(E_RECORD,	"corrupt state record", EINVAL)			\
	X(E_NOMEM,	"out of memory", ENOMEM)			\
	X(E_BLOB,	"trainer blob too large", EINVAL)		\
	X(E_ROLLBACK,	"no previous step to roll back to", EINVAL)

/* X(NAME, code, name, safetensors dtype): enum ckpt_dtype (CKPT_DTYPE_*). */
#define CKPT_DTYPES(X)				\
	X(FP16,	1, "fp16", "F16")		\
	X(BF16,	2, "bf16", "BF16")

/* X(NAME, name): enum ckpt_state (CKPT_STATE_*, from 0) of the step machine. */
#define CKPT_STATES(X)			\
	X(IDLE,		"idle")		\
	X(OPEN,		"open")		\
	X(FAILED,	"failed")

/*
 * X(NAME, name): enum ckpt_result (CKPT_RESULT_*, from 0), the outcome of the
 * last command: OVERFLOW is a step skipped for a non-finite gradient,
 * REJECTED a refused command (see last_error).
 */
#define CKPT_RESULTS(X)			\
	X(NONE,		"none")		\
	X(COMMITTED,	"committed")	\
	X(OVERFLOW,	"overflow")	\
	X(ABORTED,	"aborted")	\
	X(REJECTED,	"rejected")

/*
 * X(field, kind): the counters of the dm status INFO line, in its order
 * (kmod/dm-ckpt.rst, "Status format"), which are also fields of struct
 * ckpt_status. kind says how a field is printed and parsed: STATE and
 * RESULT by name, FRACTION as "chunks_done/n_chunks", U32/U64 in decimal.
 */
#define CKPT_STATUS_FIELDS(X)			\
	X(state,		STATE)		\
	X(committed_step,	U64)		\
	X(open_step,		U64)		\
	X(chunks_done,		FRACTION)	\
	X(overflow,		U32)		\
	X(last_result,		RESULT)		\
	X(last_error,		U32)		\
	X(first_io_error,	U32)		\
	X(steps_committed,	U64)		\
	X(steps_skipped,	U64)		\
	X(steps_aborted,	U64)		\
	X(commands_rejected,	U64)		\
	X(grad_bytes,		U64)		\
	X(param_bytes,		U64)		\
	X(io_errors,		U64)

/*
 * X(field, range): the hyperparameters of one group, fp32 bit patterns (the
 * flags a bit set), in the order of struct ckpt_hparams, of their on-disk
 * form in a BEGIN command, of the comma-separated hex words of a kernel
 * "begin" message group (flags may be left out there: 0), and of the order
 * ckpt_hparams_check() looks (it names the first bad field). range:
 * NONNEG >= 0, UNIT in [0, 1], UNIT_POS in (0, 1], FINITE any finite value
 * (all finite; -0.0 counts as 0), FLAGS known CKPT_GROUP_* bits only.
 */
#define CKPT_HPARAMS(X)				\
	X(lr,			NONNEG)		\
	X(beta1,		UNIT)		\
	X(beta2,		UNIT)		\
	X(eps,			NONNEG)		\
	X(weight_decay,		NONNEG)		\
	X(one_minus_beta1,	UNIT_POS)	\
	X(one_minus_beta2,	UNIT_POS)	\
	X(step_size,		NONNEG)		\
	X(bc2_sqrt,		UNIT_POS)	\
	X(decay,		FINITE)		\
	X(flags,		FLAGS)

/*
 * Expanders of CKPT_STATUS_FIELDS for the C structs that hold the counters
 * (the core's struct ckpt_counters and ckpt_status): the type of each kind
 * there (u32/u64 of the core's platform header; STATE and RESULT hold the
 * enum value, FRACTION its numerator, chunks_done), a member of that type,
 * and the copy of field f from *src to *dst, pointers the caller names so.
 */
#define CKPT_ABI_KIND_STATE		u32
#define CKPT_ABI_KIND_RESULT		u32
#define CKPT_ABI_KIND_FRACTION		u64
#define CKPT_ABI_KIND_U32		u32
#define CKPT_ABI_KIND_U64		u64
#define CKPT_ABI_MEMBER(f, kind)	CKPT_ABI_KIND_##kind f;
#define CKPT_ABI_COPY(f, kind)		(dst)->f = (src)->f;

/* Expanders: enums, and rows of the name tables (positional, from 0). */
#define CKPT_ABI_ENUM_ERR(name, msg, e)		CKPT_##name,
#define CKPT_ABI_ENUM_DTYPE(name, code, s, st)	CKPT_DTYPE_##name = code,
#define CKPT_ABI_ENUM_STATE(name, s)		CKPT_STATE_##name,
#define CKPT_ABI_ENUM_RESULT(name, s)		CKPT_RESULT_##name,
#define CKPT_ABI_ENUM_STATUS(f, kind)		CKPT_SF_##f,
#define CKPT_ABI_ERR_NAME(name, msg, e)		#name,
#define CKPT_ABI_ERR_MSG(name, msg, e)		msg,
#define CKPT_ABI_ERR_ERRNO(name, msg, e)	e,
#define CKPT_ABI_SECOND(name, s)		s,
#define CKPT_ABI_DTYPE_ROW(name, code, s, st)	{ code, s, st },

#define CKPT_ABI_ENUM_HP(f, range)		CKPT_HPI_##f,
/* "field f is u32 number CKPT_HPI_f of both hparams structs &&" */
#define CKPT_ABI_HP_AT(f, range)					\
	(offsetof(struct ckpt_hparams, f) == 4 * CKPT_HPI_##f &&	\
	 offsetof(struct ckpt_hparams_disk, f) == 4 * CKPT_HPI_##f) &&

/* Errors of the core and of libckpt, returned negated. */
enum ckpt_err { CKPT_ERRORS(CKPT_ABI_ENUM_ERR) CKPT_E_MAX };
enum ckpt_dtype { CKPT_DTYPES(CKPT_ABI_ENUM_DTYPE) };
enum ckpt_state { CKPT_STATES(CKPT_ABI_ENUM_STATE) CKPT_STATE_MAX };
enum ckpt_result { CKPT_RESULTS(CKPT_ABI_ENUM_RESULT) CKPT_RESULT_MAX };
/* Index of each status line field (CKPT_SF_state...), and their number. */
enum ckpt_status_field { CKPT_STATUS_FIELDS(CKPT_ABI_ENUM_STATUS) CKPT_STATUS_N };
/* Index of each hyperparameter (CKPT_HPI_lr...), and their number. */
enum ckpt_hparam_index { CKPT_HPARAMS(CKPT_ABI_ENUM_HP) CKPT_HPARAMS_N };

#endif /* CKPT_ABI_H */
