/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * Helpers shared by the dm-ckpt kernel tests (the tests/kmod test programs). They run
 * inside the test VM: busybox, dmsetup on PATH, the module loaded, a scratch
 * NVMe namespace at $CKPT_TEST_DEV (default /dev/nvme0n1) that they format
 * themselves. Everything goes through O_DIRECT so no page cache hides what
 * the target wrote.
 *
 * Built with the portable core (libckpt/core, ckpt_core_nodeps, and
 * libckpt/src/crc32c.c): the tests encode commands and
 * superblocks with the same code as the target, and compute the expected
 * state with the scalar reference of the update.
 */
#ifndef CKPT_KMOD_H
#define CKPT_KMOD_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/klog.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <signal.h>
#include <linux/dm-ioctl.h>

#include "ckpt_codec.h"
#include "ckpt_step.h"
#include "ckpt_update.h"
#include "ckpt_update_variants.h"

#define CK_NAME "ckpt_kt"
#define CK_MAX_CHUNKS 64

const char *ck_dev(void);

/* "MAJ:MIN" of a block device, as dm prints it in tables. */
void ck_devno(const char *path, char *out, size_t n);

uint64_t ck_dev_bytes(const char *path);

/* ---------------------------------------------------------------- processes */

/* Run a shell command; its output goes to out (if any). Returns the exit code. */
int ck_sh(char *out, size_t outlen, const char *fmt, ...);

/* ---------------------------------------------------------------- kernel log */

void ck_kmsg_clear(void);

/* The kernel log since the last clear, NUL-terminated, malloc'ed. */
char *ck_kmsg(void);

/* 1 if the kernel log since the last clear contains s. */
int ck_kmsg_has(const char *s);

/* 1 if the kernel log shows a kernel bug of any kind. */
int ck_kmsg_bug(void);

/* ---------------------------------------------------------------- direct I/O */

void *ck_alloc(size_t n);

/* pwrite/pread of whole buffers with O_DIRECT fds: 0 or -errno. */
int ck_pwrite(int fd, const void *buf, size_t n, uint64_t off);

int ck_pread(int fd, void *buf, size_t n, uint64_t off);

/* Unaligned-memory write through an aligned bounce buffer. */

/* Write n bytes at off of a device path (O_DIRECT, then fsync). */
int ck_write_dev(const char *dev, const void *src, size_t n, uint64_t off);

int ck_write_at(int fd, const void *src, size_t n, uint64_t off);

int ck_read_at(int fd, void *dst, size_t n, uint64_t off);

/* ---------------------------------------------------------------- numbers */

struct ck_rng {
	uint64_t s;
};

uint64_t ck_next(struct ck_rng *r);

float ck_uniform(struct ck_rng *r);

uint32_t ck_f32(double d);

/* n random bf16 gradients, uniform in [-0.01, 0.01). */
void ck_bf16_grads(struct ck_rng *r, uint16_t *grad, uint64_t n);

/* What a client sends for step t, computed in double as PyTorch does. */
struct ckpt_hparams ck_hparams(double lr, double beta1, double beta2,
						double eps, double wd, int l2, uint64_t t);

/* ---------------------------------------------------------------- the model */

/*
 * A formatted device and the state the target must leave on it: the
 * committed superblock, and per chunk the fp32 state and p_lo of each slot
 * (with COUNTS, the step count of each block too).
 */
struct ck_model {
	const char *dev;
	struct ckpt_sb sb;
	struct ckpt_regions l;
	uint32_t cp;
	uint8_t groups[CK_MAX_CHUNKS];
	uint32_t *state[2];	/* per slot: n_chunks * 3 * cp (p, m, v per chunk) */
	uint16_t *plo[2];	/* per slot: n_params */
	int valid[2][CK_MAX_CHUNKS];	/* slot holds a record for this chunk */
	struct ckpt_rec rec[2][CK_MAX_CHUNKS];
	uint64_t *counts[2];	/* COUNTS: per slot, n_params / CKPT_TENSOR_ALIGN */
};

void ck_model_free(struct ck_model *m);

/* Geometry for the tests: small chunks so sector-sized pieces matter. */
struct ckpt_geometry ck_geo(uint32_t n_chunks, uint32_t shift,
					     uint32_t n_groups, uint32_t dtype);

void ck_record_block(const struct ck_model *m, int slot, uint32_t c,
				      uint8_t *out);

/*
 * Bit rot behind the target's back: flip the bits mask of byte i (below
 * CKPT_BLOCK) of the fp32 state of chunk c's record in slot, on the test
 * device itself (O_DIRECT, then fsync). Returns 0 or -errno.
 */
int ck_flip_record_data(const struct ck_model *m, uint32_t slot, uint32_t c,
					 size_t i, uint8_t mask);

/*
 * Format the device: zero superblocks, group table (chunk % n_groups), step 0
 * in slot 0 with random p (m = v = 0), slot 1 zeroed, superblock copy 1
 * (sequence 1), with incompat feature bits incompat. Returns 0 or -errno.
 */
int ck_format_features(struct ck_model *m, const char *dev,
					const struct ckpt_geometry *g, uint64_t seed,
					uint32_t incompat);

/* Format with the p_lo checksum in every record (ctr_test adds META2 itself). */
int ck_format(struct ck_model *m, const char *dev,
			       const struct ckpt_geometry *g, uint64_t seed);

/*
 * Format only the metadata of a large geometry: superblock copy 1 (sequence
 * 1), copy 0 zeroed, and the group table (every chunk in group 0). The
 * records are not written: enough for the constructor, which reads nothing
 * else, on a sparse device far larger than the guest's memory. sb receives
 * the superblock. Returns 0 or -errno (-ENOSPC: the device is too small).
 */
int ck_format_sparse(struct ckpt_sb *sb, const char *dev,
				      const struct ckpt_geometry *g, uint64_t seed);

/* Write one superblock block (4 KiB) at copy k of the device. */
int ck_write_sb_block(const char *dev, const void *block, int k);

/*
 * Apply step t to the model as the target must: every chunk updated from the
 * committed slot into the other one. grads: n_params values. Chunks whose
 * scaled gradient or new state is not finite are not written (their bit in
 * written[] stays 0). Returns 1 if any chunk overflowed. Call
 * ck_model_commit() to commit.
 *
 * modes (COUNTS; NULL: every block updated with its group's hyperparameters):
 * per block, as the core keeps them after RANGE commands: 0 an update with
 * the group's hyperparameters, CKPT_MODE_SKIP (p, m, v and count stay, p_lo
 * rounded from p again), or 1 + an index into bias (the group's
 * hyperparameters with that step_size and bc2_sqrt). An updated block's
 * count goes up by one.
 */
int ck_model_step_modes(struct ck_model *m, uint64_t t,
					 const struct ckpt_hparams *hp, uint32_t grad_scale,
					 const uint16_t *grad, const int *which,
					 const uint8_t *modes, const struct ckpt_bias *bias);

int ck_model_step(struct ck_model *m, uint64_t t,
				   const struct ckpt_hparams *hp, uint32_t grad_scale,
				   const uint16_t *grad, const int *which);

void ck_model_commit(struct ck_model *m, uint64_t t, const void *blob,
				      uint32_t blob_len);

/*
 * A rollback to the previous step, with blob, the step committed before:
 * the superblock after the current one commits it in the other slot, whose
 * records carry the new sequence.
 */
void ck_model_rollback(struct ck_model *m, const char *blob);

/*
 * Compare the backing device with the model: the current superblock copy
 * byte for byte, and every record and p_lo the model knows of, in both
 * slots. Returns 0, or a description of the first difference in why.
 */
int ck_model_verify(const struct ck_model *m, char *why, size_t n);

/* ---------------------------------------------------------------- dm devices */

uint64_t ck_sectors(const struct ck_model *m);

/* dmsetup create without udev; the node appears under /dev/mapper. */
int ck_create(const char *name, const char *table);

/* Replace a device's table: suspend, load, resume. 0, or -1 if a step failed. */
int ck_reload(const char *name, const char *table);

void ck_remove(const char *name);

int ck_create_ckpt(const struct ck_model *m, const char *name,
				    const char *backing, const char *opts);

/* A target message through the DM_TARGET_MSG ioctl: 0 or -errno. */
int ck_dm_message(const char *name, const char *msg);

int ck_open_dm(const char *name);

/* ---------------------------------------------------------------- commands */

/* Send cmd as one write at offset 0, padded to 512 bytes: 0 or -errno. */
int ck_send(int fd, const struct ckpt_cmd *cmd);

int ck_begin(int fd, uint64_t t, uint32_t grad_scale,
			      const struct ckpt_hparams *hp, uint32_t n_groups);

int ck_commit(int fd, uint64_t t, const void *blob, uint32_t blob_len);

int ck_abort(int fd, uint64_t t);

/* ROLLBACK from committed step t (0: whichever): 0 or -errno. */
int ck_rollback(int fd, uint64_t t);

/* Read and decode the status page: 0 or -errno / -CKPT_E_*. */
int ck_status(int fd, struct ckpt_status *st);

/* Gradient bytes [off, off + len) of the GRAD window (relative to its start). */
int ck_grad(int fd, const struct ck_model *m, const uint16_t *grad,
			     uint64_t off, uint64_t len);

/* PARAM bytes [off, off + len). */
int ck_params(int fd, const struct ck_model *m, void *out, uint64_t off,
			       uint64_t len);

/* ---------------------------------------------------------------- dm events and faults */

/* The event number of a dm device (dmsetup info), or -1. */
long ck_dm_events(const char *name);

/*
 * Wait, as dmeventd does (DM_DEV_WAIT), until the event number of dm device
 * name is no longer event_nr. 0 when it changed, -ETIMEDOUT after timeout_s
 * seconds (the ioctl runs in a child that SIGALRM ends), -errno otherwise.
 */
int ck_dm_wait(const char *name, uint32_t event_nr, unsigned int timeout_s);

/*
 * Replace the table of a live dm device (suspend, load, resume): how a fault
 * layer under the target is switched on and off. 0 or -1 (out says why).
 */
int ck_dm_swap(const char *name, const char *table, char *out, size_t n);

/* 1 if the kernel has dm target type (dmsetup targets). */
int ck_dm_has_target(const char *type);

#endif /* CKPT_KMOD_H */
