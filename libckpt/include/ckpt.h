/* SPDX-License-Identifier: MIT */
/*
 * libckpt C ABI: format a dm-ckpt backing device, open it through the
 * userspace engine, and drive optimizer steps tensor by tensor.
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
 * made-up handle is refused (CKPT_E_INVAL), never dereferenced. A layout
 * builder is used by one thread at a time. ckpt_last_error() is per thread.
 */
#ifndef CKPT_H
#define CKPT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ckpt_layout_builder ckpt_layout_builder;
typedef struct ckpt_device ckpt_device;

enum ckpt_dtype_id { CKPT_FP16 = 1, CKPT_BF16 = 2 };
enum ckpt_commit_result { CKPT_COMMITTED = 1, CKPT_OVERFLOW = 2 };

/* Message of the last failed call on this thread. */
const char *ckpt_last_error(void);

ckpt_layout_builder *ckpt_layout_new(void);
void ckpt_layout_free(ckpt_layout_builder *l);
/* Tensors of different groups never share a chunk. */
int ckpt_layout_add(ckpt_layout_builder *l, const char *name, const uint64_t *shape,
		    uint32_t ndim, uint32_t group);

/*
 * Create (a file) or format (a file or block device) path for layout.
 * size: 0 for exactly what the layout needs; a file is extended to it.
 */
int ckpt_format(const char *path, const ckpt_layout_builder *l, int dtype,
		uint32_t chunk_params, uint64_t size);

int ckpt_open(const char *path, ckpt_device **out);
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
	uint32_t state;		/* 0 idle, 1 open, 2 failed */
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

struct ckpt_tensor_info {
	const char *name;	/* valid until ckpt_close */
	uint32_t ndim;
	uint32_t group;
	uint64_t shape[8];
	uint64_t numel;
	uint64_t offset;	/* in params */
};
int ckpt_tensor(ckpt_device *d, uint32_t index, struct ckpt_tensor_info *info);

/* Initial fp32 masters (moments zero) before the first step; a commit of its own. */
int ckpt_load_params(ckpt_device *d, const char *name, const float *values, uint64_t n);

/* The same for several tensors at once: one commit instead of count. */
int ckpt_load_params_multi(ckpt_device *d, uint32_t count, const char *const *names,
			   const float *const *values, const uint64_t *ns);

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
/* fp16/bf16 gradient bits of one whole tensor. */
int ckpt_write_grad(ckpt_device *d, const char *name, const uint16_t *grad, uint64_t n);
/* Returns CKPT_COMMITTED or CKPT_OVERFLOW (step skipped). */
int ckpt_commit(ckpt_device *d, const void *blob, size_t blob_len);
int ckpt_abort(ckpt_device *d);

int ckpt_read_params(ckpt_device *d, const char *name, uint16_t *out, uint64_t n);
int ckpt_read_state(ckpt_device *d, const char *name, float *p, float *m, float *v,
		    uint64_t n);
/* Copies the committed trainer blob; returns its length (may exceed cap). */
int ckpt_blob(ckpt_device *d, void *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* CKPT_H */
