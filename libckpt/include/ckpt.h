/* SPDX-License-Identifier: MIT */
/*
 * libckpt C ABI, the training path: open a dm-ckpt device through the
 * userspace engine (or a kernel target's device), load its initial state,
 * drive optimizer steps tensor by tensor, read the params, state and status
 * back, roll back one step, close. Small and stable: a function keeps the
 * version node of the release that added it (libckpt.map). Formatting,
 * import, export, verification and ckptctl's reports are ckpt_admin.h. The
 * tools and the Python package use these two headers and nothing else.
 *
 * Every function returns 0 (or a non-negative value) on success and a negated
 * enum ckpt_err on failure; ckpt_last_error() then describes what is wrong in
 * words. Nothing changes on the device when a call fails.
 *
 * Threads: any thread may call any function. The calls on one device are
 * serialized (each runs whole, the others wait); different devices run in
 * parallel. ckpt_close() waits for the call in flight on the device, and
 * every call with the handle after it fails with CKPT_E_STATE ("device is
 * closed"): a device handle is an id, never reused, not memory, so a stale or
 * made-up handle is refused (CKPT_E_INVAL), never dereferenced.
 * ckpt_last_error() is per thread.
 */
#ifndef CKPT_H
#define CKPT_H

#include <stddef.h>
#include <stdint.h>

/* enum ckpt_err, ckpt_dtype, ckpt_state, ckpt_result and their X-macro lists */
#include "ckpt_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * libckpt.so is built with -fvisibility=hidden and exports exactly the
 * functions declared here and in ckpt_admin.h (its version script,
 * libckpt.map, keeps anything else local).
 */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/*
 * The library's version, "MAJOR.MINOR.PATCH" (the VERSION file of the source
 * tree, the same as the kernel module's and the Python package's). The
 * SONAME is libckpt.so.MAJOR: it changes only when this ABI breaks.
 */
const char *ckpt_version(void);

typedef struct ckpt_device ckpt_device;

/* Message of the last failed call on this thread. */
const char *ckpt_last_error(void);

/* Frees what a ckpt_* call returned through a char ** (JSON text). */
void ckpt_free(void *p);

/*
 * Names of the ckpt_abi.h lists, from the same tables the kernel target
 * prints: never NULL, "unknown" for a value not in the list. These (and the
 * ckpt_abi_* functions of ckpt_admin.h) leave ckpt_last_error() alone.
 */
const char *ckpt_err_name(int err);		/* "E_TWICE"; err of either sign */
const char *ckpt_strerror(int err);		/* "gradient written twice in one step" */
const char *ckpt_state_name(uint32_t state);	/* "idle", "open", "failed" */
const char *ckpt_result_name(uint32_t result);	/* "committed", "overflow", ... */
const char *ckpt_dtype_name(uint32_t dtype);	/* "fp16", "bf16" */



int ckpt_open(const char *path, ckpt_device **out);
/*
 * ckpt_open with the userspace engine's worker threads (0: one per CPU) and
 * chunks in flight per worker (0: the default); a kernel target's device
 * ignores them.
 */
int ckpt_open_engine(const char *path, uint32_t workers, uint32_t depth, ckpt_device **out);
/*
 * ckpt_open_engine with flags (any other bit: E_INVAL). CKPT_OPEN_PARAM_CACHE:
 * the engine keeps the params each chunk was last written with (2 bytes per
 * param of memory) and answers reads of them from memory while the backing
 * device holds the same bytes, so reading the params back after every step
 * costs no device reads. A kernel target's device ignores it.
 */
#define CKPT_OPEN_PARAM_CACHE 1u
int ckpt_open_engine_flags(const char *path, uint32_t workers, uint32_t depth, uint32_t flags,
			   ckpt_device **out);
/* Waits for the call in flight, then closes; a closed or unknown d is ignored. */
void ckpt_close(ckpt_device *d);

/*
 * What ckpt_open had to work around: a damaged superblock copy (a newer
 * commit may have been lost) or a damaged copy of the group table or
 * manifest. Returns the number of warnings; when index is below it and msg
 * is not NULL, *msg is set to that warning (valid until ckpt_close).
 * ckptctl verify says more.
 */
int ckpt_warning(ckpt_device *d, uint32_t index, const char **msg);

struct ckpt_info {
	uint64_t committed_step;
	uint64_t open_step;	/* 0 when no step is open */
	uint32_t state;		/* enum ckpt_state */
	uint32_t dtype;
	uint64_t n_params;
	uint32_t chunk_params;
	uint32_t n_chunks;
	uint32_t n_groups;
	uint32_t n_tensors;
	uint64_t steps_committed;
	uint64_t steps_skipped;
};
int ckpt_info(ckpt_device *d, struct ckpt_info *info);

/* The geometry basics that follow the counters in struct ckpt_device_status. */
#define CKPT_STATUS_GEOMETRY(X)	\
	X(n_chunks)		\
	X(chunk_params)		\
	X(n_params)		\
	X(n_groups)		\
	X(dtype)

/*
 * The gradients of the last step a COMMIT ended (committed, or skipped for a
 * non-finite gradient), from the status page (not the dm status line):
 * grad_sumsq, the sum of the squares of the gradients as written (before
 * grad_scale), as the bits of an IEEE double (the device's global gradient
 * norm is sqrt of it times |grad_scale|); grad_sumsq_step, that step: 0 if
 * no COMMIT ended one since the device was opened (or a kernel module older
 * than these fields serves it).
 */
#define CKPT_STATUS_GRADIENTS(X)	\
	X(grad_sumsq)		\
	X(grad_sumsq_step)

#define CKPT_STATUS_MEMBER(field, kind)	uint64_t field;
#define CKPT_STATUS_GEOMETRY_MEMBER(field)	uint64_t field;

/*
 * A device's status: the counters of the dm status line (CKPT_STATUS_FIELDS
 * in ckpt_abi.h, in its order; state and last_result hold enum ckpt_state
 * and enum ckpt_result, last_error an enum ckpt_err, first_io_error an
 * errno), then CKPT_STATUS_GEOMETRY, then CKPT_STATUS_GRADIENTS. Every
 * member is a uint64_t, so member i is named by ckpt_status_field(i).
 */
struct ckpt_device_status {
	CKPT_STATUS_FIELDS(CKPT_STATUS_MEMBER)
	CKPT_STATUS_GEOMETRY(CKPT_STATUS_GEOMETRY_MEMBER)
	CKPT_STATUS_GRADIENTS(CKPT_STATUS_GEOMETRY_MEMBER)
};

/* The status of an open device (the engine's, or the kernel target's page). */
int ckpt_status(ckpt_device *d, struct ckpt_device_status *st);


/* The uuid of a device's image (16 bytes, as the superblock stores it). */
int ckpt_uuid(ckpt_device *d, uint8_t uuid[16]);

/* Tensors have at most CKPT_MAX_DIMS dimensions. */
#define CKPT_MAX_DIMS	8

struct ckpt_tensor_info {
	const char *name;	/* valid until ckpt_close */
	uint32_t ndim;
	uint32_t group;
	uint64_t shape[CKPT_MAX_DIMS];
	uint64_t numel;
	uint64_t offset;	/* in params */
};
int ckpt_tensor(ckpt_device *d, uint32_t index, struct ckpt_tensor_info *info);

/* Initial fp32 masters (moments zero) before the first step; a commit of its own. */
int ckpt_load_params(ckpt_device *d, const char *name, const float *values, uint64_t n);

/* The same for several tensors at once: one commit instead of count. */
int ckpt_load_params_multi(ckpt_device *d, uint32_t count, const char *const *names,
			   const float *const *values, const uint64_t *ns);

/*
 * A whole optimizer state from outside (torch.optim.AdamW's state_dict, say):
 * for every tensor of the device, once, its fp32 master params p, exp_avg m
 * and exp_avg_sq v (ns[i] values each) and the step they are at; committed
 * at once (a crash keeps the old state or the new) as that step, with the
 * trainer blob (blob_len <= 2 KiB). p and m finite, v finite and >= 0.
 * Only before the first step (committed step 0, else CKPT_E_STATE), with
 * the userspace engine: a kernel target's backing device is loaded before
 * the target is created on it (the image is the same). The state is
 * committed as the largest of the steps; a tensor at a smaller step (torch's
 * AdamW counts only the steps that gave a param a gradient) keeps its own
 * count, which its next bias correction uses: that needs an image with
 * per-block step counts (feature COUNTS, else CKPT_E_FEATURE).
 */
int ckpt_load_state(ckpt_device *d, uint32_t count, const char *const *names, const float *const *p,
		    const float *const *m, const float *const *v, const uint64_t *ns, const uint64_t *steps,
		    const void *blob, size_t blob_len);

struct ckpt_group_hparams {
	double lr;
	double beta1;
	double beta2;
	double eps;
	double weight_decay;
	int adam_l2;		/* Adam with L2 penalty instead of decoupled decay */
};

/*
 * Open step committed + 1; grad_scale multiplies every gradient. groups has
 * n_groups entries, the device's group count (else CKPT_E_GROUPS).
 */
int ckpt_begin(ckpt_device *d, const struct ckpt_group_hparams *groups,
	       uint32_t n_groups, double grad_scale);
/*
 * fp16/bf16 gradient bits of one whole tensor.
 *
 * With the userspace engine the write is asynchronous: it is checked (a
 * refused write returns its error at once and changes nothing), its complete
 * chunks are queued for the update, and it returns; the updates run behind
 * it, across tensor boundaries, on every worker. grad is copied before the
 * call returns (into the engine's queue), so the caller may reuse or free it
 * at once: the copy costs 2 bytes a param against the 28 the update moves,
 * and keeps the contract every caller had (a buffer owned until COMMIT would
 * turn a reused buffer into silently wrong gradients). When the queue is full
 * the call waits for a free chunk buffer. With the kernel target the write
 * is asynchronous too: it is copied into the client's aligned slabs and
 * queued on an io_uring (small writes go down together), and the target's
 * workers run across writes; a write the target refuses (E_TWICE, ...) is
 * reported by the next ckpt_write_grad, ckpt_commit or ckpt_abort, once.
 *
 * Completion is required only at ckpt_commit: every read of the device
 * (params, state, status) and every command waits for the updates queued
 * before it. An update that fails (a backing I/O error, a corrupt record)
 * fails the device; the next ckpt_write_grad, ckpt_commit or ckpt_abort
 * returns that failure with its message (ckpt_last_error), once, taking
 * nothing of the call; every later one returns CKPT_E_FAILED.
 */
int ckpt_write_grad(ckpt_device *d, const char *name, const uint16_t *grad, uint64_t n);
/*
 * Raw gradient bytes at byte offset off of the GRAD window (a tensor's
 * params start at 2 * its offset): off and len multiples of
 * ckpt_block_size(d), any order, as a trainer writing the device would.
 * Asynchronous and copied as ckpt_write_grad.
 */
int ckpt_write_grad_window(ckpt_device *d, uint64_t off, const void *buf, uint64_t len);
/*
 * Leave tensor name as it is in the open step: its params, both moments and
 * its step count (torch's param whose .grad is None). Instead of its
 * gradient, not with it. CKPT_E_FEATURE on an image formatted without
 * per-block step counts.
 */
int ckpt_skip(ckpt_device *d, const char *name);
/*
 * *step: the number of committed steps that updated tensor name (torch's
 * state["step"]); on an image without per-block counts, the committed step.
 */
int ckpt_tensor_step(ckpt_device *d, const char *name, uint64_t *step);
/* The device's write unit (512, or 4096 on a 4Kn device). */
int ckpt_block_size(ckpt_device *d);
/* Returns CKPT_RESULT_COMMITTED or CKPT_RESULT_OVERFLOW (step skipped). */
int ckpt_commit(ckpt_device *d, const void *blob, size_t blob_len);
/*
 * The sum of the squares of the gradients of the step this handle's last
 * ckpt_commit ended (committed or skipped), as written (before grad_scale):
 * the global gradient norm is sqrt(*sumsq) x |grad_scale|. The device adds
 * them up as the gradients arrive (the same bits on the engine and the
 * kernel target), so the trainer makes no pass over them. Returns 1 with
 * *sumsq set, 0 when there is none (no commit yet on this handle, or a
 * kernel module older than the grad_sumsq status field serves the device),
 * or a negative error.
 */
int ckpt_last_grad_sumsq(ckpt_device *d, double *sumsq);
int ckpt_abort(ckpt_device *d);
/*
 * Make the previous step the committed one again, with its params, moments
 * and trainer blob: the format keeps step t-1 readable until the next BEGIN.
 * *step (if not NULL) gets the step now committed. Refused with no change:
 * CKPT_E_STATE while a step is open, CKPT_E_ROLLBACK when there is nothing
 * to go back to (step 0, a step began since the last commit, or the device
 * went back once already: never two steps), CKPT_E_FAILED on a failed device.
 * The ROLLBACK command of the control block, to the userspace engine or the
 * kernel target alike; a kernel module that predates it refuses it with
 * CKPT_E_OPCODE.
 */
int ckpt_rollback(ckpt_device *d, uint64_t *step);

int ckpt_read_params(ckpt_device *d, const char *name, uint16_t *out, uint64_t n);
/*
 * The params of count tensors at once (a step's read-back): one batch of
 * reads, straight into outs[i] (ns[i] elements) where it is 4 KiB aligned,
 * else through a bounce buffer for the unaligned ends only.
 */
int ckpt_read_params_multi(ckpt_device *d, uint32_t count, const char *const *names,
			   uint16_t *const *outs, const uint64_t *ns);

/*
 * What this handle moved through the virtual device since ckpt_open, the
 * same count whichever target serves it: bytes written to the GRAD window
 * (tails padded to the block size), read from the PARAM window, and of
 * control (commands written, status pages read), with the number of
 * commands and of status-page reads. A step with nothing skipped or lagging
 * costs two commands (BEGIN, COMMIT) and one status read (after COMMIT).
 */
struct ckpt_traffic {
	uint64_t grad_bytes;
	uint64_t param_bytes;
	uint64_t control_bytes;
	uint64_t commands;
	uint64_t status_reads;
};
int ckpt_traffic(ckpt_device *d, struct ckpt_traffic *out);
/*
 * fp32 master params, exp_avg and exp_avg_sq of tensor name (n: its numel)
 * at the committed step, on either target, also while a step is open (what
 * it has applied is not state until it commits; read_params returns that).
 */
int ckpt_read_state(ckpt_device *d, const char *name, float *p, float *m, float *v,
		    uint64_t n);
/* Copies the committed trainer blob; returns its length (may exceed cap). */
int ckpt_blob(ckpt_device *d, void *buf, size_t cap);


#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* CKPT_H */
