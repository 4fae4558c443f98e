/* SPDX-License-Identifier: MIT */
/*
 * libckpt's administration ABI: what ckptctl does with an image and what a
 * binding needs to mirror this ABI. Formatting (a layout built tensor by
 * tensor, or from a manifest or a safetensors file), import, export,
 * verification, restore and the reports ckptctl prints (as JSON), the dm
 * status line, the image's uuid, the progress of the long operations, the
 * names and sizes of the ABI's lists and structs, and the format's
 * conversions (fp32 to fp16/bf16, crc32c).
 *
 * The training path (open, begin, write, commit, read, status, close,
 * errors) is ckpt.h, which this header includes; the rules there (return
 * values, ckpt_last_error, threads) hold here too. Both are one library,
 * versioned by the linker map: a function keeps the version node of the
 * release that added it (libckpt.map).
 */
#ifndef CKPT_ADMIN_H
#define CKPT_ADMIN_H

#include "ckpt.h"

/* A layout builder is used by one thread at a time. */
typedef struct ckpt_layout_builder ckpt_layout_builder;

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/*
 * Progress of the long operations on the calling thread (ckpt_format_manifest,
 * ckpt_import, ckpt_export_image, ckpt_verify, ckpt_restore): fn(ctx, what,
 * done, total), what naming the phase ("format", "import", "export",
 * "check"), done rising from 0 to total (a phase may start again, e.g. check
 * for the committed and the previous step). fn must not call libckpt. NULL
 * turns it off (the default).
 */
typedef void (*ckpt_progress_fn)(void *ctx, const char *what, uint64_t done, uint64_t total);
void ckpt_set_progress(ckpt_progress_fn fn, void *ctx);

const char *ckpt_dtype_safetensors(uint32_t dtype);	/* "F16", "BF16" */
/* The code of a dtype name ("bf16"), or -CKPT_E_DTYPE. */
int ckpt_dtype_parse(const char *name);

/*
 * How many entries a list has: "errors" (CKPT_E_MAX), "dtypes", "states",
 * "results", "status_fields" (the dm status line's), "status" (members of
 * struct ckpt_device_status); 0 for an unknown list. ckpt_dtype_code(i)
 * is the code of the i-th dtype (-CKPT_E_RANGE past the end).
 */
uint32_t ckpt_abi_count(const char *list);
int ckpt_dtype_code(uint32_t index);
/*
 * sizeof the public struct named ("ckpt_info", "ckpt_tensor_info",
 * "ckpt_group_hparams", "ckpt_device_status", "ckpt_traffic"); 0 for an
 * unknown name. A
 * binding that mirrors a struct checks its size against this.
 */
size_t ckpt_abi_sizeof(const char *name);
/*
 * The value of a constant of this header by name ("CKPT_EXPORT_LOWP",
 * "CKPT_EXPORT_OPTIMIZER", "CKPT_EXPORT_FORCE", "CKPT_RESTORE_ROLLBACK",
 * "CKPT_SHARD_RULE_EVEN", "CKPT_SHARD_RULE_Q8",
 * "CKPT_MAX_DIMS"), or of the format ("CKPT_BLOCK", the metadata block, 4096;
 * "CKPT_SECTOR", 512); -1 when unknown.
 */
int64_t ckpt_abi_constant(const char *name);

ckpt_layout_builder *ckpt_layout_new(void);
void ckpt_layout_free(ckpt_layout_builder *l);
/*
 * Tensors of different groups never share a chunk. shape has ndim entries,
 * at most CKPT_MAX_DIMS (a larger ndim is refused before shape is read).
 */
int ckpt_layout_add(ckpt_layout_builder *l, const char *name, const uint64_t *shape,
		    uint32_t ndim, uint32_t group);

/*
 * Create (a file) or format (a file or block device) path for layout.
 * size: 0 for exactly what the layout needs; a file is extended to it.
 */
int ckpt_format(const char *path, const ckpt_layout_builder *l, int dtype,
		uint32_t chunk_params, uint64_t size);

/* ckpt_format_opts flags */
#define CKPT_FORMAT_STATE_8BIT	(1u << 0)	/* 8-bit moments (feature Q8) */
#define CKPT_FORMAT_MASTER_BF16	(1u << 1)	/* bf16 masters (feature BF16M) */
#define CKPT_FORMAT_KEEP	(1u << 2)	/* refuse to format over an image or signature */

/*
 * ckpt_format with flags: CKPT_FORMAT_STATE_8BIT stores exp_avg and
 * exp_avg_sq as block-wise 8-bit codes with a scale per 256 params (6 B of
 * state per param instead of 12; docs/design.md, "8-bit moments").
 * CKPT_FORMAT_MASTER_BF16 (with CKPT_FORMAT_STATE_8BIT and dtype bf16 only,
 * else E_FEATURE) stores the masters as bf16, rounded stochastically at every
 * step: 4 B of state per param (docs/design.md, "bf16 masters").
 * CKPT_FORMAT_KEEP refuses (CKPT_E_STATE) a path holding a dm-ckpt image or
 * a signature libblkid recognizes, as `ckptctl format` does without --force;
 * without it, what is there is formatted over. A path that does not exist is
 * created without ever replacing a file that appears there meanwhile
 * (CKPT_E_STATE).
 */
int ckpt_format_opts(const char *path, const ckpt_layout_builder *l, int dtype,
		     uint32_t chunk_params, uint64_t size, uint32_t flags);

/*
 * ---- sharding: the rule that gives each rank of a sharded run
 * (ckpt.torch.OffloadAdamW over a process group, ZeRO-1) its share of a
 * layout, and the reshard of such a run's images onto another number of
 * ranks.
 *
 * The params of a layout of whole params, flattened in order, are cut at
 * world - 1 bounds; rank r holds [bound r, bound r + 1): the params wholly
 * inside it as they are, a param cut by a bound as a piece, a flat tensor
 * named "NAME[a:b]" (its params a to b - 1). CKPT_SHARD_RULE_EVEN puts bound
 * r at n r / world (n params in all), as dm-ckpt before 0.4 did;
 * CKPT_SHARD_RULE_Q8 moves it down to the nearest multiple of 256 params
 * (one 8-bit block) from the start of the param it falls in, so that the
 * 8-bit blocks of every rank's pieces are blocks of the whole param, and a
 * reshard moves them whole, codes and scale unchanged.
 */
#define CKPT_SHARD_RULE_EVEN	1u
#define CKPT_SHARD_RULE_Q8	2u

/*
 * *out: a new layout (ckpt_layout_free), rank's share of whole (a layout
 * of whole params) over world ranks by rule (0: CKPT_SHARD_RULE_Q8). With
 * world > 1 it records the share (rank, world, rule, the whole layout's
 * size and digest), which the images formatted from it keep in their
 * manifest. A rank left with no params, or a piece name longer than a
 * tensor name may be, is refused (CKPT_E_INVAL).
 */
int ckpt_layout_shard(const ckpt_layout_builder *whole, uint32_t rank, uint32_t world, uint32_t rule,
		      ckpt_layout_builder **out);
/*
 * *json (ckpt_free): {"tensors": [{"name", "shape", "group"} and, for a
 * piece, "piece": {"param", "shape", "begin"}], "shard": {"rank", "world",
 * "rule", "params", "digest", "bounds": [the world + 1 bounds]}, only for a
 * share}.
 */
int ckpt_layout_json(const ckpt_layout_builder *l, char **json);

/*
 * Makes path, a new image file (it must not exist, and is never replaced),
 * rank's share over world ranks of the committed state of the images
 * from[0..n): the images of one sharded run (every rank's, in any order) or
 * one unsharded image; files or devices, never written. The new image has
 * their dtype, chunk size, state formats and hyperparameters, their trainer
 * blob and committed step; its masters, moments and per-tensor step counts
 * are theirs, bit for bit: every value is read back from path and compared
 * before it returns (8-bit moments move in whole blocks, CKPT_SHARD_RULE_Q8;
 * images cut by CKPT_SHARD_RULE_EVEN cut blocks, and what cannot be kept
 * exactly is refused). world 1 makes an unsharded image. opts_json (NULL:
 * none): {"params": [{"name", "shape", "group"}, ...]}, the whole layout, for
 * images of dm-ckpt before 0.4, which do not record the shape of a param
 * they hold pieces of. Refused (CKPT_E_STATE): images at different steps or
 * with different blobs, a rank missing or given twice, images of different
 * runs (layouts), and an image committed to meanwhile. A failure leaves no
 * file at path. *json: {"path", "rank", "world", "step", "tensors",
 * "params", "from": [the images in rank order]}.
 */
int ckpt_reshard(const char *const *from, uint32_t n, const char *path, uint32_t rank, uint32_t world,
		 const char *opts_json, char **json);

/*
 * ---- stripe sets: one image over several drives.
 *
 * A stripe set is a small descriptor file naming drives (files or block
 * devices) and a stripe size; every path that takes an image takes a
 * descriptor (format, open, the optimizer, info, verify, export, reshard):
 * the userspace engine lays the image over the drives as dm-stripe lays a
 * device over them (stripe k at drive k % n, offset k / n stripes), so the
 * kernel target serves the same drives through a dm-stripe table of them.
 */

/*
 * Writes the descriptor path (a new path, never replacing a file there) of a
 * stripe set over drives[0..n) (1 to 64, each named once) with stripes of
 * stripe_bytes (a power of two from 4096 to 2^30; 0: 64 KiB). A drive path
 * that does not exist is created as a file of drive_bytes (its space
 * reserved; 0 refuses a missing drive); an existing file or block device is
 * taken as it is. Relative drive paths are kept relative to the descriptor's
 * folder. *json: {"path", "stripe_bytes", "drives", "bytes" (what the set
 * holds: the drives' common size in whole stripes, times n), "dm_table" (the
 * dm-stripe table line over them, when every drive is a block device)}.
 */
int ckpt_stripe_create(const char *path, uint64_t stripe_bytes, const char *const *drives, uint32_t n,
		       uint64_t drive_bytes, char **json);

/*
 * Renames the file from to path, which must not exist (a new image prepared
 * under a temporary name, as ckpt.torch.OffloadAdamW prepares one): a file
 * at path, even one another process created meanwhile, is never replaced
 * (CKPT_E_STATE, and from stays). The directory is flushed.
 */
int ckpt_rename_new(const char *from, const char *path);

/*
 * Parses the kernel target's dm status INFO line ("idle 3 0 0/8 0 committed
 * ..."): the fields of CKPT_STATUS_FIELDS separated by blanks, nothing else.
 * Sets the counters and n_chunks (the FRACTION's denominator); the other
 * geometry members are 0. Anything else fails with CKPT_E_INVAL and a
 * message naming the field; *st is then unchanged.
 */
int ckpt_dm_status_parse(const char *line, struct ckpt_device_status *st);

/* Name of member index of struct ckpt_device_status, NULL past its end. */
const char *ckpt_status_field(uint32_t index);

/*
 * *json: st as a JSON object (malloc'ed; ckpt_free): the dm status line's
 * fields by name (state and last_result as names), n_chunks, and
 * last_error_name ("-" for none) and first_io_error_name (when not 0).
 */
int ckpt_status_json(const struct ckpt_device_status *st, char **json);

/*
 * *text: the status of n devices (st[0..n), as ckpt_dm_status_parse or
 * ckpt_status gave them) in Prometheus' text exposition format (version
 * 0.0.4, malloc'ed; ckpt_free), for node_exporter's textfile collector or a
 * scrape: one family per field of the dm status line, every device's sample
 * in it, named dm_ckpt_FIELD (the counters, which only grow while a table
 * lives, dm_ckpt_FIELD_total; state and last_result one sample per value,
 * 1 for the device's: dm_ckpt_state{state="idle"}), and dm_ckpt_chunks
 * (n_chunks). labels_json is a JSON array of n objects whose string members
 * are device i's labels (name="ckpt0", ...): names as Prometheus allows
 * ([a-zA-Z_][a-zA-Z0-9_]*, not starting with "__"), values escaped here.
 * Anything else is refused (CKPT_E_INVAL).
 */
int ckpt_status_prometheus(const struct ckpt_device_status *st, uint32_t n, const char *labels_json,
			   char **text);

/*
 * The uuid of the image in the backing file or device at path (read-only; a
 * dm-ckpt device node stands for its backing device), and a uuid's text
 * form (37 bytes with the NUL: "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx").
 */
int ckpt_image_uuid(const char *path, uint8_t uuid[16]);
void ckpt_uuid_string(const uint8_t uuid[16], char out[37]);

/* fp32 values to dtype's bit patterns, rounded to nearest even as the update does. */
int ckpt_to_lowp(uint32_t dtype, const float *in, uint16_t *out, uint64_t n);
/* crc32c of p[0..len) continuing crc (0 to start), as the format's checksums. */
uint32_t ckpt_crc32c_update(uint32_t crc, const void *p, size_t len);

/* ckpt_export flags */
#define CKPT_EXPORT_LOWP	(1u << 0)	/* params in the device dtype (F16/BF16), not fp32 masters */
#define CKPT_EXPORT_OPTIMIZER	(1u << 1)	/* also NAME.exp_avg, NAME.exp_avg_sq, the trainer blob */
#define CKPT_EXPORT_FORCE	(1u << 2)	/* out may be a dm-ckpt image: it is replaced */

/*
 * Writes the committed step's tensors to the safetensors file out (written
 * as out.tmp, flushed and renamed: a failed export leaves no half file), in
 * manifest order. out is a new path (never replacing a file that appears
 * there meanwhile) or a regular file, replaced; never a device node, FIFO or
 * directory, nor a file a writer (a trainer) has open (CKPT_E_STATE, even
 * with CKPT_EXPORT_FORCE), nor a dm-ckpt image unless CKPT_EXPORT_FORCE
 * (CKPT_E_STATE). __metadata__: "format" "pt", "step", "ckpt.dtype",
 * "ckpt.uuid", "ckpt.params" "lowp" (CKPT_EXPORT_LOWP), "ckpt.trainer_blob"
 * in hex (CKPT_EXPORT_OPTIMIZER, when there is one), then the members of
 * meta_json (a JSON object of strings, NULL for none), which may replace
 * them. A device with an open step is refused (CKPT_E_STATE).
 */
int ckpt_export(ckpt_device *d, const char *out, uint32_t flags, const char *meta_json);

/*
 * ---- tool operations: what ckptctl does with an image, as JSON reports.
 *
 * Each sets *json to a malloc'ed JSON object (ckpt_free) and returns 0, or
 * fails as every call does. A dm-ckpt device node (/dev/mapper/NAME) stands
 * for its backing device where an operation only reads; an operation that
 * writes (format, import, verify --repair, restore --rollback) refuses a
 * device in use by a target.
 */

/* 1 and *backing (ckpt_free) when path is a dm-ckpt device node, else 0. */
int ckpt_backing_of(const char *path, char **backing);
/* What `ckptctl info --json` prints: geometry, layout, tensors, warnings. */
int ckpt_image_info(const char *path, char **json);
/*
 * Formats device from {"manifest": PATH} (a JSON tensor manifest) or
 * {"safetensors": PATH} (its floating-point tensors; "groups":
 * ["G:GLOB,..."], "include"/"exclude": [GLOB]) with "dtype", "chunk_params",
 * "state" ("fp32" | "8bit"), "master" ("fp32" | "bf16"), "size" and "force"
 * overriding (an export's own metadata, or the defaults); the report is
 * ckpt_image_info's plus "summary", lines describing a safetensors file's
 * selection.
 */
int ckpt_format_manifest(const char *device, const char *opts_json, char **json);
/*
 * Loads the safetensors file from into device, before its first step:
 * options "with_optimizer" (exp_avg, exp_avg_sq, "step" or the file's
 * __metadata__ step, trainer blob), "partial" (tensors missing on either
 * side are kept or skipped), "step".
 */
int ckpt_import(const char *device, const char *from, const char *opts_json, char **json);
/*
 * The validated header of a safetensors checkpoint, as import reads it: a
 * file, a sharded checkpoint's index (.json) or a model folder. {"path": the
 * file or index read, "files": [paths], "tensors": [{"name", "dtype",
 * "shape", "file": index into files, "offset": byte offset in that file,
 * "bytes"}] in file order, "metadata": the __metadata__ of every file}.
 */
int ckpt_safetensors_header(const char *path, char **json);
/* ckpt_export of the committed step of a backing image (read-only, records checked). */
int ckpt_export_image(const char *path, const char *out, uint32_t flags, char **json);
/*
 * {"report": what `ckptctl verify --json` prints, "extra": {...}}; with
 * CKPT_VERIFY_REPAIR the damaged metadata copies are rewritten first.
 */
#define CKPT_VERIFY_REPAIR	(1u << 0)
int ckpt_verify(const char *path, uint32_t flags, char **json);
/*
 * {"report": what `ckptctl restore --json` prints, "refused": true when
 * CKPT_RESTORE_ROLLBACK found no previous step to go back to, ...}.
 */
#define CKPT_RESTORE_ROLLBACK	(1u << 0)
int ckpt_restore(const char *path, uint32_t flags, char **json);

/*
 * The largest layout on bytes of device with chunk_params (0: the default,
 * raised until a chunk's p_lo covers write_unit bytes).
 */
struct ckpt_fit {
	uint32_t chunk_params;
	uint32_t n_chunks;
	uint64_t n_params;
	uint64_t backing_bytes;	/* what that layout uses */
	uint64_t record_bytes;	/* per chunk */
};
int ckpt_fit(uint64_t bytes, uint32_t chunk_params, uint64_t write_unit, struct ckpt_fit *fit);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* CKPT_ADMIN_H */
