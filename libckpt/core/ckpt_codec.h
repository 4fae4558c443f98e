/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * dm-ckpt's codecs: the on-disk format v1 (superblock, group table, records),
 * the command/status ABI of the virtual device, and the arithmetic of the
 * image's layout (struct ckpt_regions: where each region is), shared by the
 * kernel target and libckpt. ("format" is the verb: making an image.)
 *
 * Backing device (all regions 4 KiB aligned, offsets in bytes):
 *
 *   0        superblock copy 0 (4 KiB)
 *   4 KiB    superblock copy 1 (4 KiB)
 *   8 KiB    group table: 1 byte per chunk, padded to 4 KiB
 *   ...      tensor manifest (JSON text, read by userspace only), padded
 *   ...      p_lo slot 0: n_chunks * chunk_params * 2 B, contiguous
 *   ...      p_lo slot 1
 *   ...      record slot 0: n_chunks records of record_bytes each
 *   ...      record slot 1
 *   ...      with CKPT_FEATURE_INCOMPAT_META2: a second copy of the group table
 *            and the manifest (same sizes, same content), after everything
 *            else so that no offset of a v1 image moves
 *
 * A record is a 4 KiB header block followed by fp32 p[cp], m[cp], v[cp]
 * (with Q8: fp32 p[cp], u8 m[cp], u8 v[cp], fp32 m_scale[cp / 256],
 * fp32 v_scale[cp / 256], zero-padded to 4 KiB; with BF16M too, p is
 * bf16).
 * A step reads the committed slot and writes the other one; the committed slot
 * is never written, so a crash at any point leaves the committed state intact.
 *
 * Virtual device (what a trainer sees):
 *
 *   0        control block, 4 KiB: write a command, read the status page
 *   4 KiB    GRAD window: n_chunks * chunk_params * 2 B (write gradients)
 *   ...      PARAM window: same size (read low-precision params)
 */
#ifndef CKPT_CODEC_H
#define CKPT_CODEC_H

#include "ckpt_platform.h"
#include "ckpt_abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CKPT_BLOCK		4096u
#define CKPT_SECTOR		512u
#define CKPT_SB_MAGIC		0x54504b43u	/* "CKPT" */
#define CKPT_REC_MAGIC		0x43524b43u	/* "CKRC" */
#define CKPT_CMD_MAGIC		0x444d4b43u	/* "CKMD" */
#define CKPT_STATUS_MAGIC	0x54534b43u	/* "CKST" */
#define CKPT_FORMAT_VERSION	1u
#define CKPT_ABI_VERSION	1u

#define CKPT_MIN_CHUNK_SHIFT	11u	/* 2048 params: 4 KiB of p_lo */
#define CKPT_MAX_CHUNK_SHIFT	22u	/* 4 Mi params: 48 MiB of state */
#define CKPT_DEFAULT_CHUNK_SHIFT 16u
#define CKPT_MAX_CHUNKS		(1u << 24)
#define CKPT_MAX_GROUPS		64u
#define CKPT_BLOB_MAX		2048u
#define CKPT_MANIFEST_MAX	(64u << 20)
/* Tensors start at multiples of this many params (4 KiB of fp16/bf16). */
#define CKPT_TENSOR_ALIGN	2048u
/* A block: CKPT_TENSOR_ALIGN params, the unit of step counts and skips. */
#define CKPT_BLOCK_SHIFT	11u
/* COUNTS: the largest chunk whose block counts fit its record header. */
#define CKPT_COUNTS_MAX_SHIFT	19u
/* Q8: params per quantization block (one scale per moment). */
#define CKPT_Q8_SHIFT		8u
#define CKPT_Q8_BLOCK		(1u << CKPT_Q8_SHIFT)

enum ckpt_optimizer {
	CKPT_OPT_ADAM = 1,	/* state: fp32 p, exp_avg, exp_avg_sq */
};

/*
 * Feature bits of the superblock; unknown incompat/ro_compat bits refuse.
 *
 * PLO_CRC: every record header carries a crc32c of its chunk's p_lo (the
 * fp16/bf16 params of the same slot), so a reader restoring a model can
 * check them. Incompat: a writer that does not know it would leave stale
 * checksums behind.
 *
 * META2: the layout ends with a second copy of the group table and the
 * manifest (meta2_off), and the superblock carries a crc32c of the group
 * table (group_crc). A reader takes the first copy whose checksum matches.
 *
 * COUNTS: every block of CKPT_TENSOR_ALIGN params (a tensor owns whole
 * blocks) has its own step count, the number of steps that updated it, in
 * its record header (after struct ckpt_rec_disk, le64 each, checksummed by
 * count_crc). A step may skip blocks (CKPT_OP_RANGE): they keep p, m, v and
 * their count; an updated block's count must be the one its bias correction
 * is for. Needs chunk_shift <= CKPT_COUNTS_MAX_SHIFT (the counts fit the
 * header block). Without it a block's count is its record's step and
 * CKPT_OP_RANGE is refused.
 *
 * Q8: exp_avg and exp_avg_sq are stored as 8-bit codes of the dynamic
 * quantization maps (ckpt_q8_tables.h), each block of CKPT_Q8_BLOCK params
 * with its own fp32 scale (the block's largest magnitude): 6 B per param of
 * state instead of 12. Opt-in at format time (not in the default).
 *
 * BF16M: the master params are bf16, rounded stochastically at every
 * update with noise that is a function of (image uuid, step, param index)
 * only (ckpt_sr_at, ckpt_update.h), so every build gives the same bytes. The
 * chunk's p_lo is the master itself. Needs Q8 and dtype bf16 (the only
 * combination the update implements): 4 B per param of state. Opt-in.
 *
 * The others are set by format for new images (COUNTS where the chunk size
 * allows); images without them open and work as before, without those
 * checks (one metadata copy, no group table or p_lo checksum, no skipping).
 */
#define CKPT_FEATURE_INCOMPAT_PLO_CRC	(1u << 0)
#define CKPT_FEATURE_INCOMPAT_META2	(1u << 1)
#define CKPT_FEATURE_INCOMPAT_COUNTS	(1u << 2)
#define CKPT_FEATURE_INCOMPAT_Q8	(1u << 3)
#define CKPT_FEATURE_INCOMPAT_BF16M	(1u << 4)

/* What format sets on new images (minus COUNTS for chunks too large for it). */
#define CKPT_FEATURE_INCOMPAT_DEFAULT	(CKPT_FEATURE_INCOMPAT_PLO_CRC | CKPT_FEATURE_INCOMPAT_META2 | \
					 CKPT_FEATURE_INCOMPAT_COUNTS)

#define CKPT_FEATURE_COMPAT_SUPP	0u
#define CKPT_FEATURE_INCOMPAT_SUPP	(CKPT_FEATURE_INCOMPAT_DEFAULT | CKPT_FEATURE_INCOMPAT_Q8 | \
					 CKPT_FEATURE_INCOMPAT_BF16M)
#define CKPT_FEATURE_RO_COMPAT_SUPP	0u

/* Errors of the core (enum ckpt_err, ckpt_abi.h), returned negated. */
const char *ckpt_strerror(int err);
/* Names of the ckpt_abi.h lists; "unknown" for a value not in its list. */
const char *ckpt_err_name(int err);		/* either sign */
/* The errno (positive) of CKPT_ERRORS for err, either sign; EINVAL if unknown. */
int ckpt_err_errno(int err);
const char *ckpt_state_name(u32 state);
const char *ckpt_result_name(u32 result);
const char *ckpt_dtype_name(u32 dtype);
const char *ckpt_dtype_safetensors(u32 dtype);	/* "F16", "BF16" */
int ckpt_dtype_parse(const char *name);		/* code, or -CKPT_E_DTYPE */

/* ---------------- geometry and layout ---------------- */

struct ckpt_geometry {
	u32 n_chunks;
	u32 chunk_shift;	/* chunk_params = 1 << chunk_shift */
	u32 n_groups;		/* 1..CKPT_MAX_GROUPS */
	u32 dtype;		/* enum ckpt_dtype */
	u32 optimizer;		/* enum ckpt_optimizer */
	u32 manifest_bytes;	/* space reserved for the manifest, 4 KiB multiple */
};

/* Everything derived from a geometry. All values in bytes. */
struct ckpt_regions {
	u64 chunk_params;
	u64 n_params;		/* n_chunks * chunk_params */
	u64 plo_chunk_bytes;	/* chunk_params * 2 */
	u64 record_bytes;	/* 4 KiB header + ckpt_rec_data_bytes, 4 KiB aligned */
	u64 group_off, group_bytes;
	u64 manifest_off, manifest_bytes;
	u64 plo_off[2];
	u64 rec_off[2];
	u64 meta2_off;		/* second group table + manifest; 0: none */
	u64 dev_bytes;		/* minimum backing device size */
	/* virtual device */
	u64 grad_off;		/* = CKPT_BLOCK */
	u64 param_off;
	u64 window_bytes;	/* n_params * 2 */
	u64 image_off;		/* param_off + window_bytes: the IMAGE window, dev_bytes */
	u64 virt_bytes;		/* image_off + dev_bytes */
};

int ckpt_geometry_check(const struct ckpt_geometry *g);
/* The layout of geometry g for an image with incompat feature bits incompat. */
int ckpt_regions_compute_features(const struct ckpt_geometry *g, u32 incompat,
				 struct ckpt_regions *l);
/* The layout of an image without feature bits (format v1 as first released). */
int ckpt_regions_compute(const struct ckpt_geometry *g, struct ckpt_regions *l);

/* Copies of the group table and manifest: 1, or 2 with META2. */
static inline u32 ckpt_meta_copies(const struct ckpt_regions *l)
{
	return l->meta2_off ? 2 : 1;
}

static inline u64 ckpt_group_offset(const struct ckpt_regions *l, u32 copy)
{
	return copy ? l->meta2_off : l->group_off;
}

static inline u64 ckpt_manifest_offset(const struct ckpt_regions *l, u32 copy)
{
	return copy ? l->meta2_off + l->group_bytes : l->manifest_off;
}

static inline u64 ckpt_plo_offset(const struct ckpt_regions *l, u32 slot, u64 chunk)
{
	return l->plo_off[slot] + chunk * l->plo_chunk_bytes;
}

/* Bytes per master param in a record: 2 with BF16M (bf16), else 4 (fp32). */
static inline u32 ckpt_master_bytes(u32 incompat)
{
	return (incompat & CKPT_FEATURE_INCOMPAT_BF16M) ? 2 : 4;
}

/*
 * The bytes of a record's state after its header, which its data checksum
 * covers: 12 B per param (fp32 p, m, v), with Q8 the masters' bytes
 * (ckpt_master_bytes) + 2 per param and 8 B per CKPT_Q8_BLOCK params
 * (ckpt_q8_state).
 */
static inline u64 ckpt_rec_data_bytes(u32 chunk_shift, u32 incompat)
{
	if (incompat & CKPT_FEATURE_INCOMPAT_Q8)
		return ((u64)(ckpt_master_bytes(incompat) + 2) << chunk_shift) +
		       ((u64)8 << (chunk_shift - CKPT_Q8_SHIFT));
	return (u64)12 << chunk_shift;
}

/*
 * Q8: where the 8-bit state of params [first, first + n) of a chunk lies in
 * its record's data (after the masters p[cp], fp32 or with BF16M bf16);
 * first a multiple of CKPT_Q8_BLOCK. m and v are code indexes, the scales
 * fp32 bits.
 */
struct ckpt_q8_state {
	u8 *m, *v;
	u32 *m_scale, *v_scale;
};

static inline void ckpt_q8_state_at(void *data, u32 chunk_shift, u32 incompat, u64 first,
				    struct ckpt_q8_state *s)
{
	u8 *d = (u8 *)data;
	u64 cp = (u64)1 << chunk_shift, nb = cp >> CKPT_Q8_SHIFT;
	u64 pb = ckpt_master_bytes(incompat) * cp;

	s->m = d + pb + first;
	s->v = d + pb + cp + first;
	s->m_scale = (u32 *)(d + pb + 2 * cp) + (first >> CKPT_Q8_SHIFT);
	s->v_scale = (u32 *)(d + pb + 2 * cp) + nb + (first >> CKPT_Q8_SHIFT);
}

/*
 * BF16M: the seed of the stochastic rounding noise, from the image's uuid
 * (ckpt_sr_at takes it with the step and the param index).
 */
static inline u64 ckpt_sr_seed(const u8 uuid[16])
{
	u64 s = 0;
	int i;

	for (i = 0; i < 16; i++)
		s = (s << 8 | s >> 56) ^ uuid[i];
	return s;
}

static inline u64 ckpt_record_offset(const struct ckpt_regions *l, u32 slot, u64 chunk)
{
	return l->rec_off[slot] + chunk * l->record_bytes;
}

/* ---------------- superblock ---------------- */

struct ckpt_sb_disk {
	__le32 magic;
	__le32 version;
	__le32 crc32c;		/* of the whole 4 KiB block with this field zero */
	__le32 header_bytes;	/* sizeof(struct ckpt_sb_disk) */
	__le32 feature_compat;
	__le32 feature_incompat;
	__le32 feature_ro_compat;
	__le32 reserved0;
	u8 uuid[16];
	__le64 sequence;	/* +1 per superblock write; copy = sequence & 1 */

	/* geometry */
	__le32 n_chunks;
	__le32 chunk_shift;
	__le32 n_groups;
	__le32 dtype;
	__le32 optimizer;
	__le32 manifest_bytes;	/* reserved space */
	__le32 manifest_len;	/* bytes used */
	__le32 manifest_crc;
	__le64 dev_bytes;	/* layout end; the device may be larger */
	__le64 group_off;
	__le64 manifest_off;
	__le64 plo_off[2];
	__le64 rec_off[2];
	__le64 record_bytes;

	/* commit record */
	__le64 committed_step;
	__le32 committed_slot;
	__le32 blob_len;
	/* META2 (zero without it) */
	__le64 meta2_off;	/* second group table + manifest */
	__le32 group_crc;	/* crc32c of the n_chunks bytes of the group table */
	__le32 reserved2;
	__le64 reserved1[2];
	u8 blob[CKPT_BLOB_MAX];
} __packed;

/* The decoded, validated superblock. */
struct ckpt_sb {
	u8 uuid[16];
	u64 sequence;
	/* the image's feature bits, carried into every superblock written */
	u32 feature_compat;
	u32 feature_incompat;
	u32 feature_ro_compat;
	struct ckpt_geometry geo;
	struct ckpt_regions regions;
	u32 manifest_len;
	u32 manifest_crc;
	u32 group_crc;		/* with META2 */
	u64 committed_step;
	u32 committed_slot;
	u32 blob_len;
	u8 blob[CKPT_BLOB_MAX];
};

/* Encode sb into a zeroed CKPT_BLOCK buffer with its crc. */
int ckpt_sb_encode(const struct ckpt_sb *sb, void *block);
/*
 * Decode and validate one copy. dev_bytes is the backing device size; every
 * offset and size is checked against the geometry and the device.
 */
int ckpt_sb_decode(const void *block, u64 dev_bytes, struct ckpt_sb *sb);
/*
 * Choose the current superblock from the two copies as read from offsets 0
 * and CKPT_BLOCK: the valid one with the highest sequence. Returns 0 or 1, or
 * a negative error when neither is valid: that of copy 0, unless copy 0 has
 * a wrong magic number and copy 1 the right one.
 */
int ckpt_sb_pick(const void *block0, const void *block1, u64 dev_bytes,
		 struct ckpt_sb *out);
/*
 * Why the superblock copy the reader did not pick (index 0 or 1, as read from
 * index * CKPT_BLOCK) cannot be used, given the picked one cur: 0 when it is
 * blank (never written) or a valid older commit; else the negative error of
 * its decode (-CKPT_E_NO_SB for a copy at the wrong offset for its
 * sequence). A damaged copy may mean a newer commit was lost, or a commit
 * torn by a crash; the next commit writes over it. scratch is overwritten.
 */
int ckpt_sb_check_other(const void *block, u32 index, u64 dev_bytes,
			const struct ckpt_sb *cur, struct ckpt_sb *scratch);

/*
 * Check one copy of the group table (n_chunks bytes) against sb: its crc32c
 * with META2 (-CKPT_E_CRC), and every group below n_groups (-CKPT_E_LAYOUT).
 */
int ckpt_group_table_check(const struct ckpt_sb *sb, const u8 *table);

/* Where superblock sb is written: copy (sequence & 1). */
static inline u64 ckpt_sb_offset(const struct ckpt_sb *sb)
{
	return (sb->sequence & 1) * CKPT_BLOCK;
}

/* Where the next superblock write goes: never over the current copy. */
static inline u64 ckpt_sb_next_offset(const struct ckpt_sb *cur)
{
	return ((cur->sequence + 1) & 1) * CKPT_BLOCK;
}

/*
 * The superblock that commits step in slot with the trainer blob, after cur:
 * a copy of cur (uuid, features, geometry, layout, metadata checksums) with
 * sequence + 1 and the blob zero-padded. The one rule every commit follows
 * (a step's COMMIT, a load of state, verify's rollback). next may be cur.
 * Returns 0, or -CKPT_E_BLOB (too long) / -CKPT_E_INVAL with next untouched.
 */
int ckpt_sb_next(const struct ckpt_sb *cur, u64 step, u32 slot, const void *blob,
		 u32 blob_len, struct ckpt_sb *next);

/*
 * The first superblock of a new image: sequence 1 (so copy 1), step 0 in
 * slot 0, no blob, incompat the image's feature bits.
 */
void ckpt_sb_first(struct ckpt_sb *sb, const u8 *uuid, const struct ckpt_geometry *geo,
		   const struct ckpt_regions *l, u32 incompat, u32 manifest_len,
		   u32 manifest_crc, u32 group_crc);

/* ---------------- state record header ---------------- */

struct ckpt_rec_disk {
	__le32 magic;
	__le32 crc32c;		/* of this header with this field zero */
	__le32 data_crc;	/* crc32c of p, m, v (12 B * chunk_params) */
	__le32 chunk;
	__le64 step;		/* optimizer step the state is at */
	__le64 sequence;	/* superblock sequence that commits it */
	__le32 slot;
	__le32 chunk_shift;
	__le32 plo_crc;		/* PLO_CRC: crc32c of the chunk's p_lo; else 0 */
	__le32 count_crc;	/* COUNTS: crc32c of the block counts; else 0 */
	__le64 reserved[2];
	/* COUNTS: __le64 count[2^(chunk_shift - CKPT_BLOCK_SHIFT)] follows */
} __packed;

struct ckpt_rec {
	u32 chunk;
	u32 slot;
	u32 chunk_shift;
	u32 data_crc;
	u32 plo_crc;
	u32 count_crc;
	u64 step;
	u64 sequence;
};

/*
 * COUNTS: the step count of block (index in the chunk) in a record header
 * block, and setting every block's count to count (a load of state). The
 * header's seal (ckpt_rec_seal) checksums them.
 */
u64 ckpt_rec_count(const void *header, u32 block);
void ckpt_rec_set_count(void *header, u32 block, u64 count);
void ckpt_rec_set_counts(void *header, u32 chunk_shift, u64 count);

/* Encode r into a CKPT_BLOCK header block, zeroed first (no block counts). */
void ckpt_rec_encode(const struct ckpt_rec *r, void *block);
int ckpt_rec_decode(const void *block, struct ckpt_rec *r);

/* What is wrong with a state record, in the order ckpt_rec_check() looks. */
enum ckpt_rec_fault {
	CKPT_REC_OK = 0,
	CKPT_REC_HEADER,	/* header unreadable: magic, crc or a field out of range */
	CKPT_REC_PLACE,		/* another chunk's, slot's or geometry's record */
	CKPT_REC_DATA,		/* data checksum mismatch: p, m or v corrupt */
	CKPT_REC_STEP,		/* intact, but not the step and sequence expected */
	CKPT_REC_PLO,		/* p_lo checksum mismatch */
};

/*
 * The one check of a state record read from the place of chunk want->chunk
 * in slot want->slot, used by both targets before a step builds upon it and
 * by every reader: the header (magic, crc), its place (chunk, slot,
 * chunk_shift), the data checksum over the state at data
 * (ckpt_rec_data_bytes), then step and sequence; with PLO_CRC in incompat (the image's
 * feature bits), the checksum of the chunk's p_lo (2 B * 2^chunk_shift at
 * plo). data or plo NULL: that checksum is not checked (a reader of p_lo
 * alone needs only the header). With COUNTS the block counts' checksum is
 * part of the header's (CKPT_REC_HEADER).
 *
 * Returns the first fault found (CKPT_REC_OK if none); *got holds the
 * decoded header unless the fault is CKPT_REC_HEADER. A caller accepting
 * other steps or sequences (verify's rollback check) may judge a
 * CKPT_REC_STEP itself: everything before it was checked.
 */
enum ckpt_rec_fault ckpt_rec_check(const void *header, const void *data,
				   const void *plo, const struct ckpt_rec *want,
				   u32 incompat, struct ckpt_rec *got);
/*
 * Record identities, the want of every ckpt_rec_check() and what
 * ckpt_rec_seal() writes; the one place that says which step and sequence a
 * record must carry.
 *
 * ckpt_rec_committed: the record of chunk that superblock sb commits (its
 * committed slot, step and sequence).
 * ckpt_rec_next: the record of chunk a step at step writes, which the
 * superblock after sb commits (the other slot, sequence + 1).
 * data_crc and plo_crc come back zero.
 */
void ckpt_rec_committed(const struct ckpt_sb *sb, u32 chunk, struct ckpt_rec *id);
void ckpt_rec_next(const struct ckpt_sb *sb, u32 chunk, u64 step, struct ckpt_rec *id);

/*
 * Seal a record: write its header block (CKPT_BLOCK bytes at header, zeroed
 * first) with id's identity, the crc32c of the state at data
 * (ckpt_rec_data_bytes) and, with PLO_CRC in incompat, of the chunk's p_lo at plo
 * (else plo_crc is 0), and with COUNTS of the block counts in the header
 * block (kept as they are, the rest of the block zeroed; without COUNTS
 * the whole block is zeroed first and count_crc is 0). data or plo NULL: id's
 * checksum is kept (a re-stamp of a header whose data did not change).
 */
void ckpt_rec_seal(void *header, const void *data, const void *plo,
		   const struct ckpt_rec *id, u32 incompat);

/* A short description of a fault, for messages. */
const char *ckpt_rec_fault_str(enum ckpt_rec_fault f);
/* crc32c of a chunk's p_lo (what the PLO_CRC record field holds). */
u32 ckpt_plo_crc(const void *plo, u32 chunk_shift);

/* ---------------- commands (written to the control block) ---------------- */

enum ckpt_opcode {
	CKPT_OP_BEGIN = 1,
	CKPT_OP_COMMIT = 2,
	CKPT_OP_ABORT = 3,
	CKPT_OP_RANGE = 4,	/* COUNTS: skip or bias-correct ranges of the open step */
	CKPT_OP_ROLLBACK = 5,	/* the previous step committed again (no payload) */
};

/*
 * One range of a CKPT_OP_RANGE command: len bytes at off of the GRAD window
 * (whole blocks: 4 KiB aligned). CKPT_RANGE_SKIP: the step leaves its
 * params, moments and counts as they are (the gradient written there is
 * ignored). Else its blocks are updated with step_size and bc2_sqrt
 * (fp32 bits) instead of their group's: the bias correction of a block
 * whose new count is count (each such block's count must be count - 1).
 */
#define CKPT_RANGE_SKIP		(1u << 0)
#define CKPT_MAX_RANGES		64u

struct ckpt_range {
	u64 off;
	u64 len;
	u64 count;
	u32 step_size;
	u32 bc2_sqrt;
	u32 flags;
};

struct ckpt_range_disk {
	__le64 off;
	__le64 len;
	__le64 count;
	__le32 step_size;
	__le32 bc2_sqrt;
	__le32 flags;
	__le32 reserved;
} __packed;

#define CKPT_GROUP_ADAM_L2	(1u << 0)	/* Adam with L2 instead of AdamW */

/*
 * Per-group hyperparameters as fp32 bit patterns. Everything that needs pow or
 * sqrt is computed by the client in double, as PyTorch does, so the target
 * needs no libm and no float outside its FPU translation unit.
 */
/* The CKPT_HPARAMS list (ckpt_abi.h), in its order: the core checks it. */
struct ckpt_hparams {
	u32 lr;
	u32 beta1;
	u32 beta2;
	u32 eps;
	u32 weight_decay;
	u32 one_minus_beta1;	/* 1 - beta1 */
	u32 one_minus_beta2;	/* 1 - beta2 */
	u32 step_size;		/* lr / (1 - beta1^t) */
	u32 bc2_sqrt;		/* sqrt(1 - beta2^t) */
	u32 decay;		/* 1 - lr * weight_decay (AdamW) */
	u32 flags;		/* CKPT_GROUP_* */
};

struct ckpt_hparams_disk {
	__le32 lr;
	__le32 beta1;
	__le32 beta2;
	__le32 eps;
	__le32 weight_decay;
	__le32 one_minus_beta1;
	__le32 one_minus_beta2;
	__le32 step_size;
	__le32 bc2_sqrt;
	__le32 decay;
	__le32 flags;
	__le32 reserved;
} __packed;

/*
 * The range check of one group's hyperparameters, on their fp32 bit patterns:
 * what torch.optim.AdamW refuses (lr, eps, weight_decay < 0; a beta outside
 * [0, 1)) and derived fields no valid input gives (1 - beta outside (0, 1],
 * bc2_sqrt outside (0, 1], step_size < 0), every field finite, known flags.
 * A beta may be 1.0f: the fp32 of a double just below 1, which torch takes;
 * 1 - beta, computed in double, is what must be positive. -0.0 counts as 0.
 * Returns 0, or -CKPT_E_HPARAM with *field naming the first bad field (as in
 * CKPT_HPARAMS) when field is not NULL.
 */
int ckpt_hparams_check(const struct ckpt_hparams *h, const char **field);

/*
 * A group from n words in CKPT_HPARAMS order (a kernel "begin" message):
 * n is CKPT_HPARAMS_N, or one less (flags 0). Returns 0 or -CKPT_E_INVAL
 * with h untouched. The values are not checked: BEGIN does that.
 */
int ckpt_hparams_from_words(struct ckpt_hparams *h, const u32 *words, u32 n);

struct ckpt_cmd_disk {
	__le32 magic;
	__le32 version;
	__le32 crc32c;		/* of the first `length` bytes with this field zero */
	__le32 opcode;
	__le32 length;		/* header + payload bytes, <= CKPT_BLOCK */
	__le32 n_groups;	/* BEGIN; RANGE: number of ranges */
	__le32 grad_scale;	/* BEGIN: fp32 bits, multiplies every gradient */
	__le32 blob_len;	/* COMMIT */
	__le64 step;		/* ABORT, ROLLBACK: 0 means whichever (see ckpt_cmd) */
	__le64 reserved[3];
	/*
	 * BEGIN: struct ckpt_hparams_disk[n_groups]; COMMIT: blob[blob_len];
	 * RANGE: struct ckpt_range_disk[n_groups]; ABORT, ROLLBACK: none
	 */
} __packed;

/*
 * A decoded command. step: BEGIN the step it opens, COMMIT the open step,
 * RANGE the open step (not checked), ABORT the open step, ROLLBACK the
 * committed step it goes back from (to step - 1); for ABORT and ROLLBACK 0
 * means whichever step is open or committed (a ROLLBACK of step 0 has
 * nothing to go back to anyway).
 */
struct ckpt_cmd {
	u32 opcode;
	u64 step;
	u32 grad_scale;
	u32 n_groups;
	struct ckpt_hparams groups[CKPT_MAX_GROUPS];
	u32 blob_len;
	u8 blob[CKPT_BLOB_MAX];
	u32 n_ranges;		/* RANGE: 1..CKPT_MAX_RANGES */
	struct ckpt_range ranges[CKPT_MAX_RANGES];
};

/* Encode into buf (CKPT_BLOCK bytes, zeroed by the callee); returns the length or -err. */
int ckpt_cmd_encode(const struct ckpt_cmd *cmd, void *buf);
/* Decode and validate a command of len bytes (the write that carried it). */
int ckpt_cmd_decode(const void *buf, u32 len, struct ckpt_cmd *cmd);

/* ---------------- status page (read from the control block) ---------------- */

/* enum ckpt_state and enum ckpt_result: ckpt_abi.h. */

struct ckpt_status {
	u32 state;
	u32 last_result;
	u32 last_error;		/* enum ckpt_err of the last rejected command */
	u32 first_io_error;	/* errno of the first backing I/O error, 0 if none */
	u64 committed_step;
	u64 open_step;
	u32 committed_slot;
	u32 overflow;
	u64 chunks_done;	/* in the open step */
	u64 steps_committed;
	u64 steps_skipped;
	u64 steps_aborted;
	u64 commands_rejected;
	u64 grad_bytes;
	u64 param_bytes;
	u64 io_errors;
	struct ckpt_geometry geo;
	/*
	 * The gradients of the last step a COMMIT ended (committed or
	 * skipped): the sum of their squares as written (fp64 bits, before
	 * grad_scale; ckpt_grad_sumsq) and that step, 0 if none since the
	 * device was opened (or a module without it).
	 */
	u64 grad_sumsq;
	u64 grad_sumsq_step;
	u32 blob_len;
	u8 blob[CKPT_BLOB_MAX];
};

struct ckpt_status_disk {
	__le32 magic;
	__le32 version;
	__le32 crc32c;		/* of the whole block with this field zero */
	__le32 state;
	__le32 last_result;
	__le32 last_error;
	__le32 first_io_error;
	__le32 committed_slot;
	__le64 committed_step;
	__le64 open_step;
	__le32 overflow;
	__le32 n_chunks;
	__le32 chunk_shift;
	__le32 n_groups;
	__le32 dtype;
	__le32 optimizer;
	__le64 chunks_done;
	__le64 steps_committed;
	__le64 steps_skipped;
	__le64 steps_aborted;
	__le64 commands_rejected;
	__le64 grad_bytes;
	__le64 param_bytes;
	__le64 io_errors;
	__le32 manifest_bytes;
	__le32 blob_len;
	__le64 grad_sumsq;
	__le64 grad_sumsq_step;
	__le64 reserved[6];
	u8 blob[CKPT_BLOB_MAX];
} __packed;

void ckpt_status_encode(const struct ckpt_status *st, void *block);
int ckpt_status_decode(const void *block, struct ckpt_status *st);

#ifdef __cplusplus
}
#endif

#endif /* CKPT_CODEC_H */
