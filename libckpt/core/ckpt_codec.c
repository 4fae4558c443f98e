// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * dm-ckpt on-disk format v1: layout arithmetic, superblock, record header,
 * command and status page encoding.
 *
 * Every decoder treats its input as hostile: it reads nothing outside the
 * buffer it was given, checks magic, checksum and version before it trusts a
 * single field, and returns a specific -CKPT_E_* for the first defect found.
 * Encoders zero the whole block first so no stack or heap bytes leak to disk.
 *
 * Compiled unchanged into dm-ckpt.ko and libckpt: no libc beyond
 * memcpy/memset, no float, no 64-bit division, small stack frames.
 */
#include "ckpt_codec.h"

/* ---------------- error messages ---------------- */

static const char *const ckpt_err_msg[CKPT_E_MAX] = { CKPT_ERRORS(CKPT_ABI_ERR_MSG) };

/* Accepts err either sign: ckpt_strerror(-CKPT_E_CRC) == ckpt_strerror(CKPT_E_CRC). */
const char *ckpt_strerror(int err)
{
	unsigned int e;

	if (err < 0) {
		if (err == -2147483647 - 1)
			return "unknown error";
		err = -err;
	}
	e = (unsigned int)err;
	if (e >= CKPT_E_MAX || !ckpt_err_msg[e])
		return "unknown error";
	return ckpt_err_msg[e];
}

static const unsigned char ckpt_err_errnos[CKPT_E_MAX] = { CKPT_ERRORS(CKPT_ABI_ERR_ERRNO) };

int ckpt_err_errno(int err)
{
	unsigned int e = err < 0 ? 0u - (unsigned int)err : (unsigned int)err;

	return e < CKPT_E_MAX ? ckpt_err_errnos[e] : EINVAL;
}

/* Error names ("E_TWICE"): the enum's name without its prefix. */
static const char *const ckpt_err_names[CKPT_E_MAX] = { CKPT_ERRORS(CKPT_ABI_ERR_NAME) };
static const char *const ckpt_state_names[CKPT_STATE_MAX] = { CKPT_STATES(CKPT_ABI_SECOND) };
static const char *const ckpt_result_names[CKPT_RESULT_MAX] = { CKPT_RESULTS(CKPT_ABI_SECOND) };

const char *ckpt_err_name(int err)
{
	unsigned int e = err < 0 ? 0u - (unsigned int)err : (unsigned int)err;

	return e < CKPT_E_MAX ? ckpt_err_names[e] : "unknown";
}

const char *ckpt_state_name(u32 state)
{
	return state < CKPT_STATE_MAX ? ckpt_state_names[state] : "unknown";
}

const char *ckpt_result_name(u32 result)
{
	return result < CKPT_RESULT_MAX ? ckpt_result_names[result] : "unknown";
}

static const struct {
	u32 code;
	const char *name;
	const char *safetensors;
} ckpt_dtypes[] = { CKPT_DTYPES(CKPT_ABI_DTYPE_ROW) };

const char *ckpt_dtype_name(u32 dtype)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(ckpt_dtypes); i++)
		if (ckpt_dtypes[i].code == dtype)
			return ckpt_dtypes[i].name;
	return "unknown";
}

const char *ckpt_dtype_safetensors(u32 dtype)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(ckpt_dtypes); i++)
		if (ckpt_dtypes[i].code == dtype)
			return ckpt_dtypes[i].safetensors;
	return "unknown";
}

/* The code of a dtype name ("fp16", "bf16") or of its safetensors name. */
int ckpt_dtype_parse(const char *name)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(ckpt_dtypes); i++)
		if (!strcmp(name, ckpt_dtypes[i].name) || !strcmp(name, ckpt_dtypes[i].safetensors))
			return ckpt_dtypes[i].code;
	return -CKPT_E_DTYPE;
}

/* ---------------- helpers ---------------- */

/* *acc += v; returns false on u64 overflow (acc unchanged then). */
static bool ckpt_add(u64 *acc, u64 v)
{
	if (*acc + v < *acc)
		return false;
	*acc += v;
	return true;
}

static u64 ckpt_round_up_block(u64 v)
{
	return (v + (CKPT_BLOCK - 1)) & ~(u64)(CKPT_BLOCK - 1);
}

/* crc32c of len bytes at p with the 4-byte field at crc_off taken as zero. */
static u32 ckpt_crc_skip(const void *p, u32 len, u32 crc_off)
{
	static const u8 zero[4];
	const u8 *b = p;
	u32 c = ~0u;

	c = ckpt_crc32c_raw(c, b, crc_off);
	c = ckpt_crc32c_raw(c, zero, sizeof(zero));
	c = ckpt_crc32c_raw(c, b + crc_off + 4, len - crc_off - 4);
	return ~c;
}

/* ---------------- geometry and layout ---------------- */

int ckpt_geometry_check(const struct ckpt_geometry *g)
{
	if (!g)
		return -CKPT_E_INVAL;
	if (g->n_chunks < 1 || g->n_chunks > CKPT_MAX_CHUNKS)
		return -CKPT_E_GEOMETRY;
	if (g->chunk_shift < CKPT_MIN_CHUNK_SHIFT ||
	    g->chunk_shift > CKPT_MAX_CHUNK_SHIFT)
		return -CKPT_E_GEOMETRY;
	if (g->n_groups < 1 || g->n_groups > CKPT_MAX_GROUPS)
		return -CKPT_E_GEOMETRY;
	if (g->dtype != CKPT_DTYPE_FP16 && g->dtype != CKPT_DTYPE_BF16)
		return -CKPT_E_GEOMETRY;
	if (g->optimizer != CKPT_OPT_ADAM)
		return -CKPT_E_GEOMETRY;
	if (g->manifest_bytes & (CKPT_BLOCK - 1))
		return -CKPT_E_GEOMETRY;
	if (g->manifest_bytes > CKPT_MANIFEST_MAX)
		return -CKPT_E_GEOMETRY;
	return 0;
}

int ckpt_regions_compute_features(const struct ckpt_geometry *g, u32 incompat,
				 struct ckpt_regions *l)
{
	u64 plo_slot, rec_slot, off;
	int ret;

	if (!l)
		return -CKPT_E_INVAL;
	ret = ckpt_geometry_check(g);
	if (ret)
		return ret;
	if (incompat & ~CKPT_FEATURE_INCOMPAT_SUPP)
		return -CKPT_E_FEATURE;
	if ((incompat & CKPT_FEATURE_INCOMPAT_COUNTS) && g->chunk_shift > CKPT_COUNTS_MAX_SHIFT)
		return -CKPT_E_FEATURE;
	/* bf16 masters: with 8-bit moments and bf16 params, what the update implements */
	if ((incompat & CKPT_FEATURE_INCOMPAT_BF16M) &&
	    (!(incompat & CKPT_FEATURE_INCOMPAT_Q8) || g->dtype != CKPT_DTYPE_BF16))
		return -CKPT_E_FEATURE;

	memset(l, 0, sizeof(*l));
	/*
	 * The geometry bounds keep every product below 2^50, so none of the
	 * shifts and products below can overflow; the sums are checked anyway.
	 */
	l->chunk_params = (u64)1 << g->chunk_shift;
	l->n_params = (u64)g->n_chunks << g->chunk_shift;
	l->plo_chunk_bytes = l->chunk_params << 1;
	l->record_bytes = CKPT_BLOCK +
		ckpt_round_up_block(ckpt_rec_data_bytes(g->chunk_shift, incompat));
	plo_slot = l->n_params << 1;
	rec_slot = (u64)g->n_chunks * l->record_bytes;

	l->group_off = 2 * CKPT_BLOCK;
	l->group_bytes = ckpt_round_up_block(g->n_chunks);
	off = l->group_off;
	if (!ckpt_add(&off, l->group_bytes))
		return -CKPT_E_GEOMETRY;
	l->manifest_off = off;
	l->manifest_bytes = g->manifest_bytes;
	if (!ckpt_add(&off, l->manifest_bytes))
		return -CKPT_E_GEOMETRY;
	l->plo_off[0] = off;
	if (!ckpt_add(&off, plo_slot))
		return -CKPT_E_GEOMETRY;
	l->plo_off[1] = off;
	if (!ckpt_add(&off, plo_slot))
		return -CKPT_E_GEOMETRY;
	l->rec_off[0] = off;
	if (!ckpt_add(&off, rec_slot))
		return -CKPT_E_GEOMETRY;
	l->rec_off[1] = off;
	if (!ckpt_add(&off, rec_slot))
		return -CKPT_E_GEOMETRY;
	if (incompat & CKPT_FEATURE_INCOMPAT_META2) {
		/* Last, so that every offset of an image without it stays. */
		l->meta2_off = off;
		if (!ckpt_add(&off, l->group_bytes) ||
		    !ckpt_add(&off, l->manifest_bytes))
			return -CKPT_E_GEOMETRY;
	}
	l->dev_bytes = off;

	l->grad_off = CKPT_BLOCK;
	l->window_bytes = plo_slot;
	off = l->grad_off;
	if (!ckpt_add(&off, l->window_bytes))
		return -CKPT_E_GEOMETRY;
	l->param_off = off;
	if (!ckpt_add(&off, l->window_bytes))
		return -CKPT_E_GEOMETRY;
	l->image_off = off;
	if (!ckpt_add(&off, l->dev_bytes))
		return -CKPT_E_GEOMETRY;
	l->virt_bytes = off;
	return 0;
}

int ckpt_regions_compute(const struct ckpt_geometry *g, struct ckpt_regions *l)
{
	return ckpt_regions_compute_features(g, 0, l);
}

/* ---------------- superblock ---------------- */

#define CKPT_SB_CRC_OFF		8u	/* offsetof(struct ckpt_sb_disk, crc32c) */
#define CKPT_CMD_CRC_OFF	8u	/* offsetof(struct ckpt_cmd_disk, crc32c) */
#define CKPT_ST_CRC_OFF		8u	/* offsetof(struct ckpt_status_disk, crc32c) */
#define CKPT_REC_CRC_OFF	4u	/* offsetof(struct ckpt_rec_disk, crc32c) */

_Static_assert(sizeof(struct ckpt_sb_disk) <= CKPT_BLOCK, "sb fits a block");
_Static_assert(sizeof(struct ckpt_status_disk) <= CKPT_BLOCK, "status fits a block");
_Static_assert(sizeof(struct ckpt_rec_disk) <= CKPT_BLOCK, "record header fits");
_Static_assert(sizeof(struct ckpt_cmd_disk) +
	       CKPT_MAX_GROUPS * sizeof(struct ckpt_hparams_disk) <= CKPT_BLOCK,
	       "largest BEGIN fits a block");
_Static_assert(sizeof(struct ckpt_cmd_disk) + CKPT_BLOB_MAX <= CKPT_BLOCK,
	       "largest COMMIT fits a block");
_Static_assert(__builtin_offsetof(struct ckpt_sb_disk, crc32c) == CKPT_SB_CRC_OFF,
	       "sb crc offset");
_Static_assert(__builtin_offsetof(struct ckpt_cmd_disk, crc32c) == CKPT_CMD_CRC_OFF,
	       "cmd crc offset");
_Static_assert(__builtin_offsetof(struct ckpt_status_disk, crc32c) == CKPT_ST_CRC_OFF,
	       "status crc offset");
_Static_assert(__builtin_offsetof(struct ckpt_rec_disk, crc32c) == CKPT_REC_CRC_OFF,
	       "record crc offset");

/*
 * Check the stored layout of d against the one derived from geo. Returns the
 * derived layout in l (with l->dev_bytes the stored, possibly larger value).
 */
static int ckpt_sb_check_regions(const struct ckpt_sb_disk *d,
				const struct ckpt_geometry *geo, u64 dev_size,
				struct ckpt_regions *l)
{
	u64 stored_dev;
	int ret;

	ret = ckpt_regions_compute_features(geo, le32_to_cpu(d->feature_incompat), l);
	if (ret)
		return ret;
	if (le64_to_cpu(d->meta2_off) != l->meta2_off ||
	    le64_to_cpu(d->group_off) != l->group_off ||
	    le64_to_cpu(d->manifest_off) != l->manifest_off ||
	    le64_to_cpu(d->plo_off[0]) != l->plo_off[0] ||
	    le64_to_cpu(d->plo_off[1]) != l->plo_off[1] ||
	    le64_to_cpu(d->rec_off[0]) != l->rec_off[0] ||
	    le64_to_cpu(d->rec_off[1]) != l->rec_off[1] ||
	    le64_to_cpu(d->record_bytes) != l->record_bytes)
		return -CKPT_E_LAYOUT;
	stored_dev = le64_to_cpu(d->dev_bytes);
	if (stored_dev < l->dev_bytes || dev_size < stored_dev)
		return -CKPT_E_TOO_SMALL;
	l->dev_bytes = stored_dev;
	return 0;
}

int ckpt_sb_encode(const struct ckpt_sb *sb, void *block)
{
	struct ckpt_sb_disk *d = block;
	struct ckpt_regions l;
	int ret;

	if (!sb || !block)
		return -CKPT_E_INVAL;
	/* Refuse to write what ckpt_sb_decode would refuse to read. */
	ret = ckpt_regions_compute_features(&sb->geo, sb->feature_incompat, &l);
	if (ret)
		return ret;
	if (sb->regions.meta2_off != l.meta2_off ||
	    sb->regions.group_off != l.group_off ||
	    sb->regions.manifest_off != l.manifest_off ||
	    sb->regions.plo_off[0] != l.plo_off[0] ||
	    sb->regions.plo_off[1] != l.plo_off[1] ||
	    sb->regions.rec_off[0] != l.rec_off[0] ||
	    sb->regions.rec_off[1] != l.rec_off[1] ||
	    sb->regions.record_bytes != l.record_bytes)
		return -CKPT_E_LAYOUT;
	if (sb->regions.dev_bytes < l.dev_bytes)
		return -CKPT_E_TOO_SMALL;
	if (sb->committed_slot > 1)
		return -CKPT_E_LAYOUT;
	if (sb->blob_len > CKPT_BLOB_MAX)
		return -CKPT_E_BLOB;
	if (sb->manifest_len > sb->geo.manifest_bytes)
		return -CKPT_E_MANIFEST;
	if ((sb->feature_incompat & ~CKPT_FEATURE_INCOMPAT_SUPP) ||
	    (sb->feature_ro_compat & ~CKPT_FEATURE_RO_COMPAT_SUPP))
		return -CKPT_E_FEATURE;

	memset(block, 0, CKPT_BLOCK);
	d->magic = cpu_to_le32(CKPT_SB_MAGIC);
	d->version = cpu_to_le32(CKPT_FORMAT_VERSION);
	d->header_bytes = cpu_to_le32(sizeof(*d));
	d->feature_compat = cpu_to_le32(sb->feature_compat);
	d->feature_incompat = cpu_to_le32(sb->feature_incompat);
	d->feature_ro_compat = cpu_to_le32(sb->feature_ro_compat);
	memcpy(d->uuid, sb->uuid, sizeof(d->uuid));
	d->sequence = cpu_to_le64(sb->sequence);

	d->n_chunks = cpu_to_le32(sb->geo.n_chunks);
	d->chunk_shift = cpu_to_le32(sb->geo.chunk_shift);
	d->n_groups = cpu_to_le32(sb->geo.n_groups);
	d->dtype = cpu_to_le32(sb->geo.dtype);
	d->optimizer = cpu_to_le32(sb->geo.optimizer);
	d->manifest_bytes = cpu_to_le32(sb->geo.manifest_bytes);
	d->manifest_len = cpu_to_le32(sb->manifest_len);
	d->manifest_crc = cpu_to_le32(sb->manifest_crc);
	d->dev_bytes = cpu_to_le64(sb->regions.dev_bytes);
	d->group_off = cpu_to_le64(l.group_off);
	d->manifest_off = cpu_to_le64(l.manifest_off);
	d->plo_off[0] = cpu_to_le64(l.plo_off[0]);
	d->plo_off[1] = cpu_to_le64(l.plo_off[1]);
	d->rec_off[0] = cpu_to_le64(l.rec_off[0]);
	d->rec_off[1] = cpu_to_le64(l.rec_off[1]);
	d->record_bytes = cpu_to_le64(l.record_bytes);
	d->meta2_off = cpu_to_le64(l.meta2_off);
	if (sb->feature_incompat & CKPT_FEATURE_INCOMPAT_META2)
		d->group_crc = cpu_to_le32(sb->group_crc);

	d->committed_step = cpu_to_le64(sb->committed_step);
	d->committed_slot = cpu_to_le32(sb->committed_slot);
	d->blob_len = cpu_to_le32(sb->blob_len);
	memcpy(d->blob, sb->blob, sb->blob_len);

	d->crc32c = cpu_to_le32(ckpt_crc_skip(block, CKPT_BLOCK, CKPT_SB_CRC_OFF));
	return 0;
}

int ckpt_sb_decode(const void *block, u64 dev_bytes, struct ckpt_sb *sb)
{
	const struct ckpt_sb_disk *d = block;
	struct ckpt_geometry geo;
	u32 blob_len, manifest_len, slot;
	int ret;

	if (!block || !sb)
		return -CKPT_E_INVAL;
	if (le32_to_cpu(d->magic) != CKPT_SB_MAGIC)
		return -CKPT_E_MAGIC;
	if (le32_to_cpu(d->crc32c) != ckpt_crc_skip(block, CKPT_BLOCK, CKPT_SB_CRC_OFF))
		return -CKPT_E_CRC;
	if (le32_to_cpu(d->version) != CKPT_FORMAT_VERSION)
		return -CKPT_E_VERSION;
	if (le32_to_cpu(d->header_bytes) != sizeof(*d))
		return -CKPT_E_VERSION;
	if ((le32_to_cpu(d->feature_incompat) & ~CKPT_FEATURE_INCOMPAT_SUPP) ||
	    (le32_to_cpu(d->feature_ro_compat) & ~CKPT_FEATURE_RO_COMPAT_SUPP))
		return -CKPT_E_FEATURE;

	geo.n_chunks = le32_to_cpu(d->n_chunks);
	geo.chunk_shift = le32_to_cpu(d->chunk_shift);
	geo.n_groups = le32_to_cpu(d->n_groups);
	geo.dtype = le32_to_cpu(d->dtype);
	geo.optimizer = le32_to_cpu(d->optimizer);
	geo.manifest_bytes = le32_to_cpu(d->manifest_bytes);
	ret = ckpt_geometry_check(&geo);
	if (ret)
		return ret;

	ret = ckpt_sb_check_regions(d, &geo, dev_bytes, &sb->regions);
	if (ret)
		return ret;

	slot = le32_to_cpu(d->committed_slot);
	if (slot > 1)
		return -CKPT_E_LAYOUT;
	blob_len = le32_to_cpu(d->blob_len);
	if (blob_len > CKPT_BLOB_MAX)
		return -CKPT_E_BLOB;
	manifest_len = le32_to_cpu(d->manifest_len);
	if (manifest_len > geo.manifest_bytes)
		return -CKPT_E_MANIFEST;

	memcpy(sb->uuid, d->uuid, sizeof(sb->uuid));
	sb->sequence = le64_to_cpu(d->sequence);
	sb->feature_compat = le32_to_cpu(d->feature_compat);
	sb->feature_incompat = le32_to_cpu(d->feature_incompat);
	sb->feature_ro_compat = le32_to_cpu(d->feature_ro_compat);
	sb->geo = geo;
	sb->manifest_len = manifest_len;
	sb->manifest_crc = le32_to_cpu(d->manifest_crc);
	sb->group_crc = 0;
	if (sb->feature_incompat & CKPT_FEATURE_INCOMPAT_META2)
		sb->group_crc = le32_to_cpu(d->group_crc);
	sb->committed_step = le64_to_cpu(d->committed_step);
	sb->committed_slot = slot;
	sb->blob_len = blob_len;
	memcpy(sb->blob, d->blob, blob_len);
	memset(sb->blob + blob_len, 0, CKPT_BLOB_MAX - blob_len);
	return 0;
}

/*
 * No struct ckpt_sb on the stack (it is over 2 KiB): both copies are decoded
 * into out in turn and the winner is decoded again if it was not the last.
 */
int ckpt_sb_pick(const void *block0, const void *block1, u64 dev_bytes,
		 struct ckpt_sb *out)
{
	u64 seq0 = 0, seq1 = 0;
	int r0, r1;

	if (!block0 || !block1 || !out)
		return -CKPT_E_INVAL;

	r0 = ckpt_sb_decode(block0, dev_bytes, out);
	if (!r0) {
		seq0 = out->sequence;
		/* Copy k is only ever written with (sequence & 1) == k. */
		if (seq0 & 1)
			r0 = -CKPT_E_NO_SB;
	}
	r1 = ckpt_sb_decode(block1, dev_bytes, out);
	if (!r1) {
		seq1 = out->sequence;
		if (!(seq1 & 1))
			r1 = -CKPT_E_NO_SB;
	}
	/* Parity makes equal sequences impossible when both are valid. */
	if (!r1 && (r0 || seq1 > seq0))
		return 1;
	if (!r0) {
		r0 = ckpt_sb_decode(block0, dev_bytes, out);
		return r0 ? r0 : 0;
	}
	/* Neither is valid: a copy with the right magic says more about why. */
	return r0 == -CKPT_E_MAGIC ? r1 : r0;
}

static bool ckpt_all_zero(const u8 *p, u32 n)
{
	u32 i;

	for (i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

int ckpt_sb_check_other(const void *block, u32 index, u64 dev_bytes,
			const struct ckpt_sb *cur, struct ckpt_sb *scratch)
{
	int ret;

	if (!block || !cur || !scratch || index > 1)
		return -CKPT_E_INVAL;
	if (ckpt_all_zero(block, CKPT_BLOCK))
		return 0;
	ret = ckpt_sb_decode(block, dev_bytes, scratch);
	if (ret)
		return ret;
	if ((scratch->sequence & 1) != index || scratch->sequence >= cur->sequence)
		return -CKPT_E_NO_SB;
	return 0;
}

int ckpt_group_table_check(const struct ckpt_sb *sb, const u8 *table)
{
	u32 i;

	if (!sb || !table)
		return -CKPT_E_INVAL;
	if ((sb->feature_incompat & CKPT_FEATURE_INCOMPAT_META2) &&
	    ckpt_crc32c(table, sb->geo.n_chunks) != sb->group_crc)
		return -CKPT_E_CRC;
	for (i = 0; i < sb->geo.n_chunks; i++)
		if (table[i] >= sb->geo.n_groups)
			return -CKPT_E_LAYOUT;
	return 0;
}

int ckpt_sb_next(const struct ckpt_sb *cur, u64 step, u32 slot, const void *blob,
		 u32 blob_len, struct ckpt_sb *next)
{
	if (!cur || !next || slot > 1 || (blob_len && !blob))
		return -CKPT_E_INVAL;
	if (blob_len > CKPT_BLOB_MAX)
		return -CKPT_E_BLOB;
	if (next != cur)
		*next = *cur;
	next->sequence++;
	next->committed_step = step;
	next->committed_slot = slot;
	/* The blob may be cur's own, in place when next is cur. */
	if (blob_len && blob != next->blob)
		memcpy(next->blob, blob, blob_len);
	memset(next->blob + blob_len, 0, CKPT_BLOB_MAX - blob_len);
	next->blob_len = blob_len;
	return 0;
}

void ckpt_sb_first(struct ckpt_sb *sb, const u8 *uuid, const struct ckpt_geometry *geo,
		   const struct ckpt_regions *l, u32 incompat, u32 manifest_len,
		   u32 manifest_crc, u32 group_crc)
{
	memset(sb, 0, sizeof(*sb));
	memcpy(sb->uuid, uuid, sizeof(sb->uuid));
	sb->sequence = 1;
	sb->feature_incompat = incompat;
	sb->geo = *geo;
	sb->regions = *l;
	sb->manifest_len = manifest_len;
	sb->manifest_crc = manifest_crc;
	sb->group_crc = group_crc;
}

/* ---------------- state record header ---------------- */

/* The header fields, with the bytes of struct ckpt_rec_disk; the rest is kept. */
static void ckpt_rec_encode_header(const struct ckpt_rec *r, void *block)
{
	struct ckpt_rec_disk *d = block;

	memset(block, 0, sizeof(*d));
	d->magic = cpu_to_le32(CKPT_REC_MAGIC);
	d->data_crc = cpu_to_le32(r->data_crc);
	d->chunk = cpu_to_le32(r->chunk);
	d->step = cpu_to_le64(r->step);
	d->sequence = cpu_to_le64(r->sequence);
	d->slot = cpu_to_le32(r->slot);
	d->chunk_shift = cpu_to_le32(r->chunk_shift);
	d->plo_crc = cpu_to_le32(r->plo_crc);
	d->count_crc = cpu_to_le32(r->count_crc);
	d->crc32c = cpu_to_le32(ckpt_crc_skip(block, sizeof(*d), CKPT_REC_CRC_OFF));
}

void ckpt_rec_encode(const struct ckpt_rec *r, void *block)
{
	memset(block, 0, CKPT_BLOCK);
	ckpt_rec_encode_header(r, block);
}

/*
 * Validates the header on its own. Readers of state call ckpt_rec_check(),
 * which also checks the record's place, step and checksums.
 */
int ckpt_rec_decode(const void *block, struct ckpt_rec *r)
{
	const struct ckpt_rec_disk *d = block;
	u32 slot, shift;

	if (!block || !r)
		return -CKPT_E_INVAL;
	if (le32_to_cpu(d->magic) != CKPT_REC_MAGIC)
		return -CKPT_E_MAGIC;
	if (le32_to_cpu(d->crc32c) != ckpt_crc_skip(block, sizeof(*d), CKPT_REC_CRC_OFF))
		return -CKPT_E_CRC;
	slot = le32_to_cpu(d->slot);
	shift = le32_to_cpu(d->chunk_shift);
	if (slot > 1)
		return -CKPT_E_RECORD;
	if (shift < CKPT_MIN_CHUNK_SHIFT || shift > CKPT_MAX_CHUNK_SHIFT)
		return -CKPT_E_RECORD;
	if (le32_to_cpu(d->chunk) >= CKPT_MAX_CHUNKS)
		return -CKPT_E_RECORD;
	r->chunk = le32_to_cpu(d->chunk);
	r->slot = slot;
	r->chunk_shift = shift;
	r->data_crc = le32_to_cpu(d->data_crc);
	r->plo_crc = le32_to_cpu(d->plo_crc);
	r->count_crc = le32_to_cpu(d->count_crc);
	r->step = le64_to_cpu(d->step);
	r->sequence = le64_to_cpu(d->sequence);
	return 0;
}

u32 ckpt_plo_crc(const void *plo, u32 chunk_shift)
{
	return ckpt_crc32c(plo, (size_t)2 << chunk_shift);
}

#define CKPT_REC_COUNTS_OFF	((u32)sizeof(struct ckpt_rec_disk))

_Static_assert(sizeof(struct ckpt_rec_disk) +
	       (8u << (CKPT_COUNTS_MAX_SHIFT - CKPT_BLOCK_SHIFT)) <= CKPT_BLOCK,
	       "block counts fit the record header");

static u32 ckpt_rec_count_crc(const void *header, u32 chunk_shift)
{
	return ckpt_crc32c((const u8 *)header + CKPT_REC_COUNTS_OFF,
			   (size_t)8 << (chunk_shift - CKPT_BLOCK_SHIFT));
}

u64 ckpt_rec_count(const void *header, u32 block)
{
	const __le64 *c = (const __le64 *)((const u8 *)header + CKPT_REC_COUNTS_OFF);

	return le64_to_cpu(c[block]);
}

void ckpt_rec_set_count(void *header, u32 block, u64 count)
{
	__le64 *c = (__le64 *)((u8 *)header + CKPT_REC_COUNTS_OFF);

	c[block] = cpu_to_le64(count);
}

void ckpt_rec_set_counts(void *header, u32 chunk_shift, u64 count)
{
	u32 b;

	for (b = 0; b < 1u << (chunk_shift - CKPT_BLOCK_SHIFT); b++)
		ckpt_rec_set_count(header, b, count);
}

enum ckpt_rec_fault ckpt_rec_check(const void *header, const void *data,
				   const void *plo, const struct ckpt_rec *want,
				   u32 incompat, struct ckpt_rec *got)
{
	if (ckpt_rec_decode(header, got) < 0)
		return CKPT_REC_HEADER;
	if ((incompat & CKPT_FEATURE_INCOMPAT_COUNTS) &&
	    (got->chunk_shift > CKPT_COUNTS_MAX_SHIFT ||
	     ckpt_rec_count_crc(header, got->chunk_shift) != got->count_crc))
		return CKPT_REC_HEADER;
	if (got->chunk != want->chunk || got->slot != want->slot ||
	    got->chunk_shift != want->chunk_shift)
		return CKPT_REC_PLACE;
	if (data && ckpt_crc32c(data, ckpt_rec_data_bytes(want->chunk_shift, incompat)) !=
		    got->data_crc)
		return CKPT_REC_DATA;
	if (got->step != want->step || got->sequence != want->sequence)
		return CKPT_REC_STEP;
	if (plo && (incompat & CKPT_FEATURE_INCOMPAT_PLO_CRC) &&
	    ckpt_plo_crc(plo, want->chunk_shift) != got->plo_crc)
		return CKPT_REC_PLO;
	return CKPT_REC_OK;
}

void ckpt_rec_committed(const struct ckpt_sb *sb, u32 chunk, struct ckpt_rec *id)
{
	memset(id, 0, sizeof(*id));
	id->chunk = chunk;
	id->slot = sb->committed_slot;
	id->chunk_shift = sb->geo.chunk_shift;
	id->step = sb->committed_step;
	id->sequence = sb->sequence;
}

void ckpt_rec_next(const struct ckpt_sb *sb, u32 chunk, u64 step, struct ckpt_rec *id)
{
	ckpt_rec_committed(sb, chunk, id);
	id->slot ^= 1;
	id->step = step;
	id->sequence++;
}

void ckpt_rec_seal(void *header, const void *data, const void *plo,
		   const struct ckpt_rec *id, u32 incompat)
{
	struct ckpt_rec r = *id;
	u32 n;

	if (data)
		r.data_crc = ckpt_crc32c(data, ckpt_rec_data_bytes(r.chunk_shift, incompat));
	if (!(incompat & CKPT_FEATURE_INCOMPAT_PLO_CRC))
		r.plo_crc = 0;
	else if (plo)
		r.plo_crc = ckpt_plo_crc(plo, r.chunk_shift);
	if (!(incompat & CKPT_FEATURE_INCOMPAT_COUNTS) || r.chunk_shift > CKPT_COUNTS_MAX_SHIFT) {
		r.count_crc = 0;
		ckpt_rec_encode(&r, header);
		return;
	}
	/* The counts stay; the rest of the block after them is zero. */
	n = CKPT_REC_COUNTS_OFF + (8u << (r.chunk_shift - CKPT_BLOCK_SHIFT));
	memset((u8 *)header + n, 0, CKPT_BLOCK - n);
	r.count_crc = ckpt_rec_count_crc(header, r.chunk_shift);
	ckpt_rec_encode_header(&r, header);
}

const char *ckpt_rec_fault_str(enum ckpt_rec_fault f)
{
	switch (f) {
	case CKPT_REC_OK:
		return "ok";
	case CKPT_REC_HEADER:
		return "corrupt header";
	case CKPT_REC_PLACE:
		return "misplaced record";
	case CKPT_REC_DATA:
		return "data checksum mismatch";
	case CKPT_REC_STEP:
		return "stale record";
	case CKPT_REC_PLO:
		return "p_lo checksum mismatch";
	}
	return "unknown fault";
}

/* ---------------- commands ---------------- */

#define CKPT_CMD_HDR	((u32)sizeof(struct ckpt_cmd_disk))
#define CKPT_HP_BYTES	((u32)sizeof(struct ckpt_hparams_disk))
#define CKPT_RANGE_BYTES	((u32)sizeof(struct ckpt_range_disk))

_Static_assert(sizeof(struct ckpt_cmd_disk) + CKPT_MAX_RANGES * sizeof(struct ckpt_range_disk) <=
	       CKPT_BLOCK, "largest RANGE fits a block");

/* ---------------- hyperparameters ---------------- */

enum ckpt_hp_range {
	CKPT_HP_NONNEG,
	CKPT_HP_UNIT,
	CKPT_HP_UNIT_POS,
	CKPT_HP_FINITE,
	CKPT_HP_FLAGS,
};

#define CKPT_HP_ROW(f, range)						\
	{ #f, CKPT_HP_##range, offsetof(struct ckpt_hparams, f),		\
	  offsetof(struct ckpt_hparams_disk, f) },

static const struct ckpt_hp_field {
	const char *name;
	u8 range;
	u8 off;		/* in struct ckpt_hparams */
	u8 disk_off;	/* in struct ckpt_hparams_disk */
} ckpt_hp_fields[] = { CKPT_HPARAMS(CKPT_HP_ROW) };

/*
 * Not one byte moves: both structs hold the list's u32 fields in its order,
 * 4 bytes apart, the disk form one reserved word more.
 */
_Static_assert(CKPT_HPARAMS(CKPT_ABI_HP_AT) 1, "hparams fields out of list order");
_Static_assert(sizeof(struct ckpt_hparams) == 4 * CKPT_HPARAMS_N, "hparams size");
_Static_assert(sizeof(struct ckpt_hparams_disk) == 4 * CKPT_HPARAMS_N + 4, "hparams disk size");
_Static_assert(ARRAY_SIZE(ckpt_hp_fields) == CKPT_HPARAMS_N, "hparams table");

#define CKPT_F32_EXP	0x7f800000u
#define CKPT_F32_SIGN	0x80000000u
/* Non-negative finite floats order like their bit patterns. */
#define CKPT_F32_ONE	0x3f800000u

static bool ckpt_f32_finite(u32 bits)
{
	return (bits & CKPT_F32_EXP) != CKPT_F32_EXP;
}

/* >= 0 (+0 or -0 included), finite */
static bool ckpt_f32_nonneg(u32 bits)
{
	return ckpt_f32_finite(bits) && (!(bits & CKPT_F32_SIGN) || bits == CKPT_F32_SIGN);
}

static bool ckpt_hp_ok(u8 range, u32 bits)
{
	switch (range) {
	case CKPT_HP_NONNEG:
		return ckpt_f32_nonneg(bits);
	case CKPT_HP_UNIT:	/* [0, 1] */
		return ckpt_f32_nonneg(bits) && (bits & ~CKPT_F32_SIGN) <= CKPT_F32_ONE;
	case CKPT_HP_UNIT_POS:	/* (0, 1] */
		return !(bits & CKPT_F32_SIGN) && bits != 0 && bits <= CKPT_F32_ONE;
	case CKPT_HP_FINITE:
		return ckpt_f32_finite(bits);
	case CKPT_HP_FLAGS:
		return !(bits & ~CKPT_GROUP_ADAM_L2);
	}
	return false;
}

static u32 ckpt_u32_at(const void *base, u32 off)
{
	u32 v;

	memcpy(&v, (const u8 *)base + off, sizeof(v));
	return v;
}

static void ckpt_u32_put(void *base, u32 off, u32 v)
{
	memcpy((u8 *)base + off, &v, sizeof(v));
}

int ckpt_hparams_check(const struct ckpt_hparams *h, const char **field)
{
	u32 i;

	for (i = 0; i < ARRAY_SIZE(ckpt_hp_fields); i++) {
		const struct ckpt_hp_field *f = &ckpt_hp_fields[i];

		if (!ckpt_hp_ok(f->range, ckpt_u32_at(h, f->off))) {
			if (field)
				*field = f->name;
			return -CKPT_E_HPARAM;
		}
	}
	return 0;
}

int ckpt_hparams_from_words(struct ckpt_hparams *h, const u32 *words, u32 n)
{
	u32 i;

	if (!h || !words || n > CKPT_HPARAMS_N || n + 1 < CKPT_HPARAMS_N)
		return -CKPT_E_INVAL;
	memset(h, 0, sizeof(*h));
	for (i = 0; i < n; i++)
		ckpt_u32_put(h, ckpt_hp_fields[i].off, words[i]);
	return 0;
}

static void ckpt_hparams_put(struct ckpt_hparams_disk *d, const struct ckpt_hparams *h)
{
	__le32 v;
	u32 i;

	for (i = 0; i < ARRAY_SIZE(ckpt_hp_fields); i++) {
		v = cpu_to_le32(ckpt_u32_at(h, ckpt_hp_fields[i].off));
		memcpy((u8 *)d + ckpt_hp_fields[i].disk_off, &v, sizeof(v));
	}
	d->reserved = 0;
}

static void ckpt_hparams_get(struct ckpt_hparams *h, const struct ckpt_hparams_disk *d)
{
	__le32 v;
	u32 i;

	for (i = 0; i < ARRAY_SIZE(ckpt_hp_fields); i++) {
		memcpy(&v, (const u8 *)d + ckpt_hp_fields[i].disk_off, sizeof(v));
		ckpt_u32_put(h, ckpt_hp_fields[i].off, le32_to_cpu(v));
	}
}

int ckpt_cmd_encode(const struct ckpt_cmd *cmd, void *buf)
{
	struct ckpt_cmd_disk *d = buf;
	u8 *payload;
	u32 len, i;

	if (!cmd || !buf)
		return -CKPT_E_INVAL;
	payload = (u8 *)buf + CKPT_CMD_HDR;
	switch (cmd->opcode) {
	case CKPT_OP_BEGIN:
		if (cmd->n_groups < 1 || cmd->n_groups > CKPT_MAX_GROUPS)
			return -CKPT_E_GROUPS;
		len = CKPT_CMD_HDR + cmd->n_groups * CKPT_HP_BYTES;
		break;
	case CKPT_OP_COMMIT:
		if (cmd->blob_len > CKPT_BLOB_MAX)
			return -CKPT_E_BLOB;
		len = CKPT_CMD_HDR + cmd->blob_len;
		break;
	case CKPT_OP_ABORT:
	case CKPT_OP_ROLLBACK:
		len = CKPT_CMD_HDR;
		break;
	case CKPT_OP_RANGE:
		if (cmd->n_ranges < 1 || cmd->n_ranges > CKPT_MAX_RANGES)
			return -CKPT_E_LENGTH;
		len = CKPT_CMD_HDR + cmd->n_ranges * CKPT_RANGE_BYTES;
		break;
	default:
		return -CKPT_E_OPCODE;
	}

	memset(buf, 0, CKPT_BLOCK);
	d->magic = cpu_to_le32(CKPT_CMD_MAGIC);
	d->version = cpu_to_le32(CKPT_ABI_VERSION);
	d->opcode = cpu_to_le32(cmd->opcode);
	d->length = cpu_to_le32(len);
	d->step = cpu_to_le64(cmd->step);
	if (cmd->opcode == CKPT_OP_BEGIN) {
		d->n_groups = cpu_to_le32(cmd->n_groups);
		d->grad_scale = cpu_to_le32(cmd->grad_scale);
		for (i = 0; i < cmd->n_groups; i++)
			ckpt_hparams_put((struct ckpt_hparams_disk *)payload + i,
					 &cmd->groups[i]);
	} else if (cmd->opcode == CKPT_OP_COMMIT) {
		d->blob_len = cpu_to_le32(cmd->blob_len);
		memcpy(payload, cmd->blob, cmd->blob_len);
	} else if (cmd->opcode == CKPT_OP_RANGE) {
		d->n_groups = cpu_to_le32(cmd->n_ranges);
		for (i = 0; i < cmd->n_ranges; i++) {
			struct ckpt_range_disk *rd = (struct ckpt_range_disk *)payload + i;
			const struct ckpt_range *r = &cmd->ranges[i];

			rd->off = cpu_to_le64(r->off);
			rd->len = cpu_to_le64(r->len);
			rd->count = cpu_to_le64(r->count);
			rd->step_size = cpu_to_le32(r->step_size);
			rd->bc2_sqrt = cpu_to_le32(r->bc2_sqrt);
			rd->flags = cpu_to_le32(r->flags);
		}
	}
	d->crc32c = cpu_to_le32(ckpt_crc_skip(buf, len, CKPT_CMD_CRC_OFF));
	return (int)len;
}

/*
 * Reads at most min(len, d->length) bytes of buf. Fields that do not belong
 * to the opcode (n_groups of a COMMIT, ...) and reserved fields are ignored
 * and come back zero.
 */
int ckpt_cmd_decode(const void *buf, u32 len, struct ckpt_cmd *cmd)
{
	const struct ckpt_cmd_disk *d = buf;
	const u8 *payload;
	u32 length, opcode, n_groups = 0, blob_len = 0, want, i;

	/* Not even an offset from a NULL buf: that is undefined behaviour. */
	if (!buf || !cmd)
		return -CKPT_E_INVAL;
	payload = (const u8 *)buf + CKPT_CMD_HDR;
	if (len < CKPT_CMD_HDR)
		return -CKPT_E_LENGTH;
	if (le32_to_cpu(d->magic) != CKPT_CMD_MAGIC)
		return -CKPT_E_MAGIC;
	length = le32_to_cpu(d->length);
	if (length < CKPT_CMD_HDR || length > CKPT_BLOCK || length > len)
		return -CKPT_E_LENGTH;
	if (le32_to_cpu(d->crc32c) != ckpt_crc_skip(buf, length, CKPT_CMD_CRC_OFF))
		return -CKPT_E_CRC;
	if (le32_to_cpu(d->version) != CKPT_ABI_VERSION)
		return -CKPT_E_VERSION;

	opcode = le32_to_cpu(d->opcode);
	switch (opcode) {
	case CKPT_OP_BEGIN:
		n_groups = le32_to_cpu(d->n_groups);
		if (n_groups < 1 || n_groups > CKPT_MAX_GROUPS)
			return -CKPT_E_GROUPS;
		want = CKPT_CMD_HDR + n_groups * CKPT_HP_BYTES;
		break;
	case CKPT_OP_COMMIT:
		blob_len = le32_to_cpu(d->blob_len);
		if (blob_len > CKPT_BLOB_MAX)
			return -CKPT_E_BLOB;
		want = CKPT_CMD_HDR + blob_len;
		break;
	case CKPT_OP_ABORT:
	case CKPT_OP_ROLLBACK:
		want = CKPT_CMD_HDR;
		break;
	case CKPT_OP_RANGE:
		n_groups = le32_to_cpu(d->n_groups);
		if (n_groups < 1 || n_groups > CKPT_MAX_RANGES)
			return -CKPT_E_LENGTH;
		want = CKPT_CMD_HDR + n_groups * CKPT_RANGE_BYTES;
		break;
	default:
		return -CKPT_E_OPCODE;
	}
	if (length != want)
		return -CKPT_E_LENGTH;

	memset(cmd, 0, sizeof(*cmd));
	cmd->opcode = opcode;
	cmd->step = le64_to_cpu(d->step);
	if (opcode == CKPT_OP_BEGIN) {
		cmd->n_groups = n_groups;
		cmd->grad_scale = le32_to_cpu(d->grad_scale);
		for (i = 0; i < n_groups; i++)
			ckpt_hparams_get(&cmd->groups[i],
					 (const struct ckpt_hparams_disk *)payload + i);
	} else if (opcode == CKPT_OP_COMMIT) {
		cmd->blob_len = blob_len;
		memcpy(cmd->blob, payload, blob_len);
	} else if (opcode == CKPT_OP_RANGE) {
		cmd->n_ranges = n_groups;
		for (i = 0; i < n_groups; i++) {
			const struct ckpt_range_disk *rd = (const struct ckpt_range_disk *)payload + i;
			struct ckpt_range *r = &cmd->ranges[i];

			r->off = le64_to_cpu(rd->off);
			r->len = le64_to_cpu(rd->len);
			r->count = le64_to_cpu(rd->count);
			r->step_size = le32_to_cpu(rd->step_size);
			r->bc2_sqrt = le32_to_cpu(rd->bc2_sqrt);
			r->flags = le32_to_cpu(rd->flags);
		}
	}
	return 0;
}

/* ---------------- status page ---------------- */

void ckpt_status_encode(const struct ckpt_status *st, void *block)
{
	struct ckpt_status_disk *d = block;
	u32 blob_len = st->blob_len;

	if (blob_len > CKPT_BLOB_MAX)
		blob_len = CKPT_BLOB_MAX;
	memset(block, 0, CKPT_BLOCK);
	d->magic = cpu_to_le32(CKPT_STATUS_MAGIC);
	d->version = cpu_to_le32(CKPT_ABI_VERSION);
	d->state = cpu_to_le32(st->state);
	d->last_result = cpu_to_le32(st->last_result);
	d->last_error = cpu_to_le32(st->last_error);
	d->first_io_error = cpu_to_le32(st->first_io_error);
	d->committed_slot = cpu_to_le32(st->committed_slot);
	d->committed_step = cpu_to_le64(st->committed_step);
	d->open_step = cpu_to_le64(st->open_step);
	d->overflow = cpu_to_le32(st->overflow);
	d->n_chunks = cpu_to_le32(st->geo.n_chunks);
	d->chunk_shift = cpu_to_le32(st->geo.chunk_shift);
	d->n_groups = cpu_to_le32(st->geo.n_groups);
	d->dtype = cpu_to_le32(st->geo.dtype);
	d->optimizer = cpu_to_le32(st->geo.optimizer);
	d->chunks_done = cpu_to_le64(st->chunks_done);
	d->steps_committed = cpu_to_le64(st->steps_committed);
	d->steps_skipped = cpu_to_le64(st->steps_skipped);
	d->steps_aborted = cpu_to_le64(st->steps_aborted);
	d->commands_rejected = cpu_to_le64(st->commands_rejected);
	d->grad_bytes = cpu_to_le64(st->grad_bytes);
	d->param_bytes = cpu_to_le64(st->param_bytes);
	d->io_errors = cpu_to_le64(st->io_errors);
	d->manifest_bytes = cpu_to_le32(st->geo.manifest_bytes);
	d->blob_len = cpu_to_le32(blob_len);
	d->grad_sumsq = cpu_to_le64(st->grad_sumsq);
	d->grad_sumsq_step = cpu_to_le64(st->grad_sumsq_step);
	memcpy(d->blob, st->blob, blob_len);
	d->crc32c = cpu_to_le32(ckpt_crc_skip(block, CKPT_BLOCK, CKPT_ST_CRC_OFF));
}

int ckpt_status_decode(const void *block, struct ckpt_status *st)
{
	const struct ckpt_status_disk *d = block;
	u32 blob_len;

	if (!block || !st)
		return -CKPT_E_INVAL;
	if (le32_to_cpu(d->magic) != CKPT_STATUS_MAGIC)
		return -CKPT_E_MAGIC;
	if (le32_to_cpu(d->crc32c) != ckpt_crc_skip(block, CKPT_BLOCK, CKPT_ST_CRC_OFF))
		return -CKPT_E_CRC;
	if (le32_to_cpu(d->version) != CKPT_ABI_VERSION)
		return -CKPT_E_VERSION;
	blob_len = le32_to_cpu(d->blob_len);
	if (blob_len > CKPT_BLOB_MAX)
		return -CKPT_E_BLOB;
	if (le32_to_cpu(d->state) > CKPT_STATE_FAILED ||
	    le32_to_cpu(d->last_result) > CKPT_RESULT_REJECTED ||
	    le32_to_cpu(d->committed_slot) > 1)
		return -CKPT_E_INVAL;

	memset(st, 0, sizeof(*st));
	st->state = le32_to_cpu(d->state);
	st->last_result = le32_to_cpu(d->last_result);
	st->last_error = le32_to_cpu(d->last_error);
	st->first_io_error = le32_to_cpu(d->first_io_error);
	st->committed_slot = le32_to_cpu(d->committed_slot);
	st->committed_step = le64_to_cpu(d->committed_step);
	st->open_step = le64_to_cpu(d->open_step);
	st->overflow = le32_to_cpu(d->overflow);
	st->geo.n_chunks = le32_to_cpu(d->n_chunks);
	st->geo.chunk_shift = le32_to_cpu(d->chunk_shift);
	st->geo.n_groups = le32_to_cpu(d->n_groups);
	st->geo.dtype = le32_to_cpu(d->dtype);
	st->geo.optimizer = le32_to_cpu(d->optimizer);
	st->geo.manifest_bytes = le32_to_cpu(d->manifest_bytes);
	st->chunks_done = le64_to_cpu(d->chunks_done);
	st->steps_committed = le64_to_cpu(d->steps_committed);
	st->steps_skipped = le64_to_cpu(d->steps_skipped);
	st->steps_aborted = le64_to_cpu(d->steps_aborted);
	st->commands_rejected = le64_to_cpu(d->commands_rejected);
	st->grad_bytes = le64_to_cpu(d->grad_bytes);
	st->param_bytes = le64_to_cpu(d->param_bytes);
	st->io_errors = le64_to_cpu(d->io_errors);
	st->grad_sumsq = le64_to_cpu(d->grad_sumsq);
	st->grad_sumsq_step = le64_to_cpu(d->grad_sumsq_step);
	st->blob_len = blob_len;
	memcpy(st->blob, d->blob, blob_len);
	return 0;
}
