// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * The step state machine shared by the kernel target and the userspace
 * engine. See ckpt_step.h. Every entry point that can refuse checks all its
 * preconditions before it changes anything, so a refused command leaves the
 * machine exactly as it was; the host then calls ckpt_sm_rejected().
 *
 * No I/O, no allocation, no float (fp32 values are checked as bit patterns).
 */
#include "ckpt_step.h"
#define CKPT_UPDATE_INT_ONLY
#include "ckpt_update_impl.h"

#define CKPT_EIO_ERRNO	5	/* EIO, for a failure reported without an errno */

#define CKPT_F32_EXP	0x7f800000u
#define CKPT_F32_SIGN	0x80000000u

/* Finite fp32 bit pattern: exponent not all ones (neither inf nor NaN). */
static bool ckpt_f32_finite(u32 bits)
{
	return (bits & CKPT_F32_EXP) != CKPT_F32_EXP;
}

static bool ckpt_bit_test(const u64 *bits, u32 i)
{
	return (bits[i >> 6] >> (i & 63)) & 1;
}

static void ckpt_bit_set(u64 *bits, u32 i)
{
	bits[i >> 6] |= (u64)1 << (i & 63);
}

static void ckpt_bits_clear(u64 *bits, u32 n_bits)
{
	if (bits)
		memset(bits, 0, ckpt_bitmap_words(n_bits) * sizeof(u64));
}

void ckpt_sm_init(struct ckpt_step_sm *sm, const struct ckpt_sb *sb,
		  u64 *claimed, u64 *applied)
{
	memset(sm, 0, sizeof(*sm));
	sm->state = CKPT_STATE_IDLE;
	sm->n_chunks = sb->geo.n_chunks;
	sm->n_groups = sb->geo.n_groups;
	sm->committed_slot = sb->committed_slot & 1;
	sm->committed_step = sb->committed_step;
	sm->claimed = claimed;
	sm->applied = applied;
	ckpt_bits_clear(claimed, sm->n_chunks);
	ckpt_bits_clear(applied, sm->n_chunks);
	sm->last_result = CKPT_RESULT_NONE;
}

int ckpt_sm_begin_check(const struct ckpt_step_sm *sm, const struct ckpt_cmd *cmd)
{
	u32 i, gs = cmd->grad_scale;
	int ret;

	if (cmd->opcode != CKPT_OP_BEGIN)
		return -CKPT_E_OPCODE;
	if (sm->state == CKPT_STATE_FAILED)
		return -CKPT_E_FAILED;
	if (sm->state != CKPT_STATE_IDLE)
		return -CKPT_E_STATE;
	if (cmd->step != sm->committed_step + 1 || cmd->step == 0)
		return -CKPT_E_STEP;
	if (cmd->n_groups != sm->n_groups || cmd->n_groups > CKPT_MAX_GROUPS)
		return -CKPT_E_GROUPS;
	/* grad_scale: finite and > 0 (no sign bit, not +0). */
	if (!ckpt_f32_finite(gs) || (gs & CKPT_F32_SIGN) || gs == 0)
		return -CKPT_E_HPARAM;
	for (i = 0; i < cmd->n_groups; i++) {
		ret = ckpt_hparams_check(&cmd->groups[i], NULL);
		if (ret)
			return ret;
	}
	return 0;
}

void ckpt_sm_clear_bitmaps(struct ckpt_step_sm *sm, u64 *claimed, u64 *applied)
{
	ckpt_bits_clear(claimed, sm->n_chunks);
	ckpt_bits_clear(applied, sm->n_chunks);
}

void ckpt_sm_begin_open(struct ckpt_step_sm *sm, const struct ckpt_cmd *cmd)
{
	u32 i;

	sm->chunks_claimed = 0;
	sm->chunks_applied = 0;
	sm->overflow = 0;
	sm->count_fault = 0;
	sm->grad_scale = cmd->grad_scale;
	memset(sm->groups, 0, sizeof(sm->groups));
	for (i = 0; i < cmd->n_groups; i++)
		sm->groups[i] = cmd->groups[i];
	sm->open_step = cmd->step;
	sm->state = CKPT_STATE_OPEN;
	sm->last_result = CKPT_RESULT_NONE;
	sm->last_error = CKPT_OK;
}

int ckpt_sm_begin(struct ckpt_step_sm *sm, const struct ckpt_cmd *cmd)
{
	int ret = ckpt_sm_begin_check(sm, cmd);

	if (ret)
		return ret;
	ckpt_sm_clear_bitmaps(sm, sm->claimed, sm->applied);
	ckpt_sm_begin_open(sm, cmd);
	return 0;
}

int ckpt_sm_claim(struct ckpt_step_sm *sm, u32 chunk)
{
	if (sm->state == CKPT_STATE_FAILED)
		return -CKPT_E_FAILED;
	if (sm->state != CKPT_STATE_OPEN)
		return -CKPT_E_STATE;
	if (chunk >= sm->n_chunks)
		return -CKPT_E_RANGE;
	if (ckpt_bit_test(sm->claimed, chunk))
		return -CKPT_E_TWICE;
	ckpt_bit_set(sm->claimed, chunk);
	sm->chunks_claimed++;
	return 0;
}

/*
 * A chunk's update finished. written: its new state (p_lo and record) is on
 * the backing device in the destination slot; the host may skip writing once
 * the step has overflowed. Calls that do not match a claim of the open step
 * (a late completion after ABORT, a host bug) are ignored.
 */
void ckpt_sm_applied(struct ckpt_step_sm *sm, u32 chunk, bool nonfinite, bool written)
{
	if (sm->state != CKPT_STATE_OPEN || chunk >= sm->n_chunks)
		return;
	if (!ckpt_bit_test(sm->claimed, chunk) ||
	    ckpt_bit_test(sm->applied, chunk) ||
	    sm->chunks_applied >= sm->chunks_claimed)
		return;
	if (nonfinite)
		sm->overflow = 1;
	if (written)
		ckpt_bit_set(sm->applied, chunk);
	sm->chunks_applied++;
}

void ckpt_sm_count_fault(struct ckpt_step_sm *sm, u32 chunk)
{
	if (sm->state != CKPT_STATE_OPEN || chunk >= sm->n_chunks ||
	    !ckpt_bit_test(sm->claimed, chunk) || ckpt_bit_test(sm->applied, chunk) ||
	    sm->chunks_applied >= sm->chunks_claimed)
		return;
	sm->count_fault = 1;
	sm->chunks_applied++;
}

int ckpt_sm_commit(struct ckpt_step_sm *sm, const struct ckpt_cmd *cmd)
{
	if (cmd->opcode != CKPT_OP_COMMIT)
		return -CKPT_E_OPCODE;
	if (sm->state == CKPT_STATE_FAILED)
		return -CKPT_E_FAILED;
	if (sm->state != CKPT_STATE_OPEN)
		return -CKPT_E_STATE;
	if (cmd->step != sm->open_step)
		return -CKPT_E_STEP;
	if (sm->chunks_applied < sm->n_chunks)
		return -CKPT_E_INCOMPLETE;
	if (cmd->blob_len > CKPT_BLOB_MAX)
		return -CKPT_E_BLOB;
	if (sm->count_fault)
		return -CKPT_E_STEP;

	if (sm->overflow) {
		sm->steps_skipped++;
		sm->state = CKPT_STATE_IDLE;
		sm->last_result = CKPT_RESULT_OVERFLOW;
		sm->last_error = CKPT_OK;
		return CKPT_RESULT_OVERFLOW;
	}
	/* The host now flushes, writes the superblock, then ckpt_sm_committed(). */
	return CKPT_RESULT_COMMITTED;
}

void ckpt_sm_committed(struct ckpt_step_sm *sm)
{
	if (sm->state != CKPT_STATE_OPEN)
		return;
	sm->committed_step = sm->open_step;
	sm->committed_slot ^= 1;
	sm->steps_committed++;
	sm->state = CKPT_STATE_IDLE;
	sm->last_result = CKPT_RESULT_COMMITTED;
	sm->last_error = CKPT_OK;
}

void ckpt_sm_commit_failed(struct ckpt_step_sm *sm, int io_errno)
{
	ckpt_sm_fail(sm, io_errno);
}

int ckpt_sm_abort(struct ckpt_step_sm *sm, const struct ckpt_cmd *cmd)
{
	if (cmd->opcode != CKPT_OP_ABORT)
		return -CKPT_E_OPCODE;
	if (sm->state == CKPT_STATE_FAILED)
		return -CKPT_E_FAILED;
	if (sm->state != CKPT_STATE_OPEN)
		return -CKPT_E_STATE;
	/* Step 0 means "whatever step is open". */
	if (cmd->step != 0 && cmd->step != sm->open_step)
		return -CKPT_E_STEP;
	sm->steps_aborted++;
	sm->state = CKPT_STATE_IDLE;
	sm->last_result = CKPT_RESULT_ABORTED;
	sm->last_error = CKPT_OK;
	return 0;
}

void ckpt_sm_fail(struct ckpt_step_sm *sm, int io_errno)
{
	u32 e;

	if (io_errno < 0)
		e = -(u32)io_errno;
	else
		e = (u32)io_errno;
	if (!e)
		e = CKPT_EIO_ERRNO;
	if (!sm->first_io_error)
		sm->first_io_error = e;
	sm->io_errors++;
	sm->state = CKPT_STATE_FAILED;
}

void ckpt_sm_rejected(struct ckpt_step_sm *sm, int err)
{
	if (err < 0)
		err = -err;
	sm->last_error = (u32)err;
	sm->last_result = CKPT_RESULT_REJECTED;
	sm->commands_rejected++;
}

u32 ckpt_sm_read_slot(const struct ckpt_step_sm *sm, u32 chunk)
{
	if (sm->state == CKPT_STATE_OPEN && chunk < sm->n_chunks &&
	    ckpt_bit_test(sm->applied, chunk))
		return ckpt_sm_dst_slot(sm);
	return ckpt_sm_src_slot(sm);
}

void ckpt_sm_counters(const struct ckpt_step_sm *sm, u64 grad_bytes, u64 param_bytes,
		      struct ckpt_counters *k)
{
	bool open = sm->state == CKPT_STATE_OPEN;

	memset(k, 0, sizeof(*k));
	k->state = sm->state;
	k->committed_step = sm->committed_step;
	k->open_step = open ? sm->open_step : 0;
	k->chunks_done = open ? sm->chunks_applied : 0;
	k->overflow = open ? sm->overflow : 0;
	k->last_result = sm->last_result;
	k->last_error = sm->last_error;
	k->first_io_error = sm->first_io_error;
	k->steps_committed = sm->steps_committed;
	k->steps_skipped = sm->steps_skipped;
	k->steps_aborted = sm->steps_aborted;
	k->commands_rejected = sm->commands_rejected;
	k->grad_bytes = grad_bytes;
	k->param_bytes = param_bytes;
	k->io_errors = sm->io_errors;
	k->committed_slot = sm->committed_slot;
}

/* The status page's counters are k's, field by field of the list. */
static void ckpt_counters_to_status(const struct ckpt_counters *src, struct ckpt_status *dst)
{
	CKPT_STATUS_FIELDS(CKPT_ABI_COPY)
	dst->committed_slot = src->committed_slot;
}

void ckpt_sm_status(const struct ckpt_step_sm *sm, const struct ckpt_sb *sb,
		    struct ckpt_status *st)
{
	struct ckpt_counters k;

	ckpt_sm_counters(sm, 0, 0, &k);
	memset(st, 0, sizeof(*st));
	/* grad_bytes and param_bytes are the host's counters (0 here): it fills them. */
	ckpt_counters_to_status(&k, st);
	st->grad_sumsq = sm->grad_sumsq;
	st->grad_sumsq_step = sm->grad_sumsq_step;
	if (sb) {
		st->geo = sb->geo;
		st->blob_len = sb->blob_len <= CKPT_BLOB_MAX ? sb->blob_len : 0;
		memcpy(st->blob, sb->blob, st->blob_len);
	}
}

/* ---------------- status line ---------------- */

enum ckpt_field_kind {
	CKPT_KIND_STATE,
	CKPT_KIND_RESULT,
	CKPT_KIND_U32,
	CKPT_KIND_U64,
	CKPT_KIND_FRACTION,
};

#define CKPT_CTR_ROW(f, kind)						\
	{ CKPT_KIND_##kind, offsetof(struct ckpt_counters, f),		\
	  sizeof(((struct ckpt_counters *)0)->f) },

/* The status line's fields, in CKPT_STATUS_FIELDS order. */
static const struct ckpt_ctr_field {
	u8 kind;
	u8 off;
	u8 size;
} ckpt_ctr_fields[] = { CKPT_STATUS_FIELDS(CKPT_CTR_ROW) };
_Static_assert(sizeof(struct ckpt_counters) <= 0xff, "counter offsets fit a u8");

static u64 ckpt_ctr_get(const struct ckpt_counters *k, const struct ckpt_ctr_field *f)
{
	const u8 *p = (const u8 *)k + f->off;
	u32 v32;
	u64 v64;

	if (f->size == sizeof(u32)) {
		memcpy(&v32, p, sizeof(v32));
		return v32;
	}
	memcpy(&v64, p, sizeof(v64));
	return v64;
}

static void ckpt_ctr_set(struct ckpt_counters *k, const struct ckpt_ctr_field *f, u64 v)
{
	u8 *p = (u8 *)k + f->off;
	u32 v32 = (u32)v;

	if (f->size == sizeof(u32))
		memcpy(p, &v32, sizeof(v32));
	else
		memcpy(p, &v, sizeof(v));
}

/* Append s (NUL-terminated) at *pos; false when it would not fit with a NUL. */
static bool ckpt_put_str(char *buf, u32 len, u32 *pos, const char *s)
{
	while (*s) {
		if (*pos + 1 >= len)
			return false;
		buf[(*pos)++] = *s++;
	}
	return true;
}

static bool ckpt_put_u64(char *buf, u32 len, u32 *pos, u64 v)
{
	char digits[21];
	int i = 20;

	digits[i] = '\0';
	do {
		digits[--i] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	return ckpt_put_str(buf, len, pos, digits + i);
}

int ckpt_status_line(const struct ckpt_counters *k, u32 n_chunks, char *buf, u32 len)
{
	u32 i, pos = 0;
	bool ok = len > 0;

	for (i = 0; ok && i < ARRAY_SIZE(ckpt_ctr_fields); i++) {
		const struct ckpt_ctr_field *f = &ckpt_ctr_fields[i];
		u64 v = ckpt_ctr_get(k, f);

		if (i)
			ok = ckpt_put_str(buf, len, &pos, " ");
		if (!ok)
			break;
		switch (f->kind) {
		case CKPT_KIND_STATE:
			ok = ckpt_put_str(buf, len, &pos, ckpt_state_name((u32)v));
			break;
		case CKPT_KIND_RESULT:
			ok = ckpt_put_str(buf, len, &pos, ckpt_result_name((u32)v));
			break;
		case CKPT_KIND_FRACTION:
			ok = ckpt_put_u64(buf, len, &pos, v) &&
			     ckpt_put_str(buf, len, &pos, "/") &&
			     ckpt_put_u64(buf, len, &pos, n_chunks);
			break;
		default:
			ok = ckpt_put_u64(buf, len, &pos, v);
			break;
		}
	}
	if (!ok) {
		if (len)
			buf[0] = '\0';
		return -CKPT_E_INVAL;
	}
	buf[pos] = '\0';
	return (int)pos;
}

/*
 * Strict decimal at s[*pos..end), no sign, no leading zero, at most max,
 * ending at end or at the byte stop.
 */
static bool ckpt_get_u64(const char *s, u32 end, u32 *pos, char stop, u64 max, u64 *out)
{
	u32 i = *pos;
	u64 v = 0;

	if (i >= end || s[i] < '0' || s[i] > '9')
		return false;
	if (s[i] == '0' && i + 1 < end && s[i + 1] >= '0' && s[i + 1] <= '9')
		return false;
	for (; i < end && s[i] >= '0' && s[i] <= '9'; i++) {
		u32 d = s[i] - '0';

		/* v * 10 + d would pass 2^64 - 1 (whose tenth is ...161, rest 5) */
		if (v > 1844674407370955161ULL || (v == 1844674407370955161ULL && d > 5))
			return false;
		v = v * 10 + d;
		if (v > max)
			return false;
	}
	if (i < end && s[i] != stop)
		return false;
	*pos = i;
	*out = v;
	return true;
}

/* One of the n names name(0..n-1), ending at end or at a space. */
static bool ckpt_get_name(const char *s, u32 end, u32 *pos, const char *(*name)(u32),
			  u32 n, u64 *out)
{
	u32 v;

	for (v = 0; v < n; v++) {
		const char *t = name(v);
		u32 i = *pos;

		while (*t && i < end && s[i] == *t) {
			i++;
			t++;
		}
		if (!*t && (i == end || s[i] == ' ')) {
			*pos = i;
			*out = v;
			return true;
		}
	}
	return false;
}

#define CKPT_U32_MAX	0xffffffffULL

int ckpt_status_line_parse(const char *s, u32 len, struct ckpt_counters *out, u32 *n_chunks)
{
	return ckpt_status_line_parse_at(s, len, out, n_chunks, NULL);
}

int ckpt_status_line_parse_at(const char *s, u32 len, struct ckpt_counters *out, u32 *n_chunks,
			      u32 *field)
{
	struct ckpt_counters k;
	u32 i, end = 0, pos = 0, bad = CKPT_STATUS_N;
	u64 v = 0, n = 0;
	bool ok = true;

	if (!s || !out || !n_chunks)
		return -CKPT_E_INVAL;
	while (end < len && s[end])
		end++;
	if (end && s[end - 1] == '\n')
		end--;
	memset(&k, 0, sizeof(k));
	for (i = 0; ok && i < ARRAY_SIZE(ckpt_ctr_fields); i++) {
		const struct ckpt_ctr_field *f = &ckpt_ctr_fields[i];
		u64 max = f->size == sizeof(u32) ? CKPT_U32_MAX : ~0ULL;

		bad = i;
		if (i && (pos >= end || s[pos++] != ' ')) {
			ok = false;
			break;
		}
		switch (f->kind) {
		case CKPT_KIND_STATE:
			ok = ckpt_get_name(s, end, &pos, ckpt_state_name, CKPT_STATE_MAX, &v);
			break;
		case CKPT_KIND_RESULT:
			ok = ckpt_get_name(s, end, &pos, ckpt_result_name, CKPT_RESULT_MAX, &v);
			break;
		case CKPT_KIND_FRACTION:
			/* "done/n": the '/' must be there, done <= n */
			ok = ckpt_get_u64(s, end, &pos, '/', max, &v) && pos < end;
			if (ok) {
				pos++;
				ok = ckpt_get_u64(s, end, &pos, ' ', CKPT_U32_MAX, &n) && v <= n;
			}
			break;
		default:
			ok = ckpt_get_u64(s, end, &pos, ' ', max, &v);
			break;
		}
		if (ok)
			ckpt_ctr_set(&k, f, v);
	}
	if (!ok || pos != end) {
		if (field)
			*field = ok ? CKPT_STATUS_N : bad;
		return -CKPT_E_INVAL;
	}
	*out = k;	/* committed_slot is not in the line: 0 */
	*n_chunks = (u32)n;
	return 0;
}

/* ---------------- sector coverage ---------------- */

/* The bits of word w that lie in the sector range [first, end), or 0. */
static u64 ckpt_range_mask(u32 w, u32 first, u32 end)
{
	u64 wlo = (u64)w << 6, whi = wlo + 64;
	u64 lo = first > wlo ? first : wlo;
	u64 hi = end < whi ? end : whi;
	u64 m;

	if (lo >= hi)
		return 0;
	m = ~(u64)0 << (lo - wlo);
	if (hi - wlo < 64)
		m &= ((u64)1 << (hi - wlo)) - 1;
	return m;
}

int ckpt_cover_add(u64 *bits, u32 n_sectors, u32 first, u32 count)
{
	u32 end, w, w0, w1;

	if ((u64)first + count > n_sectors)
		return -CKPT_E_RANGE;
	if (!count)
		return 0;
	end = first + count;
	w0 = first >> 6;
	w1 = (end - 1) >> 6;
	for (w = w0; w <= w1; w++)
		if (bits[w] & ckpt_range_mask(w, first, end))
			return -CKPT_E_TWICE;
	for (w = w0; w <= w1; w++)
		bits[w] |= ckpt_range_mask(w, first, end);
	return 0;
}

bool ckpt_cover_full(const u64 *bits, u32 n_sectors)
{
	u32 w, words = n_sectors >> 6;
	u32 rest = n_sectors & 63;

	for (w = 0; w < words; w++)
		if (bits[w] != ~(u64)0)
			return false;
	if (rest) {
		u64 m = ((u64)1 << rest) - 1;

		if ((bits[words] & m) != m)
			return false;
	}
	return true;
}

/* ---------------- the step protocol ---------------- */

u32 ckpt_stage_count(u64 staging_bytes, u64 chunk_bytes, u32 n_chunks)
{
	/* chunk_bytes is a power of two: a shift, no 64-bit division */
	u64 n = chunk_bytes ? staging_bytes >> __builtin_ctzll(chunk_bytes) : 0;
	u64 hi = n_chunks > 2 ? n_chunks : 2;

	if (n < 2)
		n = 2;
	return (u32)(n > hi ? hi : n);
}

void ckpt_step_release_stages(struct ckpt_step *cs)
{
	u32 i, words = ckpt_bitmap_words(cs->sectors);

	for (i = 0; i < cs->mem.n_stages; i++) {
		struct ckpt_stage_buf *s = &cs->mem.stages[i];

		if (s->chunk != CKPT_STAGE_FREE)
			cs->mem.stage_of[s->chunk] = CKPT_STAGE_FREE;
		s->chunk = CKPT_STAGE_FREE;
		s->done_next = CKPT_STAGE_FREE;
		memset(s->cover, 0, words * sizeof(u64));
	}
	cs->free_stages = cs->mem.n_stages;
	cs->done_first = CKPT_STAGE_FREE;
}

void ckpt_step_init(struct ckpt_step *cs, const struct ckpt_step_ops *ops, void *host,
		    struct ckpt_sb *sb, const struct ckpt_step_mem *mem)
{
	u32 i;

	memset(cs, 0, sizeof(*cs));
	cs->ops = ops;
	cs->host = host;
	cs->sb = sb;
	cs->mem = *mem;
	cs->chunk_bytes = sb->layout.plo_chunk_bytes;
	cs->cb_shift = sb->geo.chunk_shift + 1;	/* 2 bytes per param */
	cs->sectors = (u32)(cs->chunk_bytes >> 9);
	cs->layout = sb->layout;
	ckpt_sm_init(&cs->sm, sb, mem->claimed, mem->applied);
	for (i = 0; i < sb->geo.n_chunks; i++)
		mem->stage_of[i] = CKPT_STAGE_FREE;
	for (i = 0; i < mem->n_stages; i++)
		mem->stages[i].chunk = CKPT_STAGE_FREE;
	ckpt_step_release_stages(cs);
}

void ckpt_step_restart(struct ckpt_step *cs)
{
	ckpt_step_release_stages(cs);
	ckpt_sm_clear_bitmaps(&cs->sm, cs->mem.claimed, cs->mem.applied);
	cs->ops->lock(cs->host);
	ckpt_sm_init(&cs->sm, cs->sb, NULL, NULL);
	cs->sm.claimed = cs->mem.claimed;
	cs->sm.applied = cs->mem.applied;
	cs->ops->unlock(cs->host);
}

static bool ckpt_cover_any(const u64 *bits, u32 first, u32 count)
{
	u32 s;

	for (s = first; s < first + count; s++)
		if (ckpt_bit_test(bits, s))
			return true;
	return false;
}

/* Every piece of a gradient write, before anything changes. Under the sm lock. */
static int __ckpt_grad_check(const struct ckpt_step *cs, u64 off, u64 len)
{
	const struct ckpt_step_sm *sm = &cs->sm;
	const u64 cb = cs->chunk_bytes;
	u32 free = cs->free_stages;

	if (sm->state == CKPT_STATE_FAILED)
		return -CKPT_E_FAILED;
	if (sm->state != CKPT_STATE_OPEN)
		return -CKPT_E_STATE;
	if ((off | len) & (CKPT_SECTOR - 1) ||
	    off > ((u64)sm->n_chunks << cs->cb_shift) ||
	    len > ((u64)sm->n_chunks << cs->cb_shift) - off)
		return -CKPT_E_RANGE;
	while (len) {
		u32 chunk = (u32)(off >> cs->cb_shift);
		u64 in = off & (cb - 1);
		u64 n = len < cb - in ? len : cb - in;
		u32 si = cs->mem.stage_of[chunk];

		if (ckpt_bit_test(sm->claimed, chunk))
			return -CKPT_E_TWICE;
		if (n == cb) {
			/* A whole chunk over sectors already staged: written twice. */
			if (si != CKPT_STAGE_FREE)
				return -CKPT_E_TWICE;
		} else if (si == CKPT_STAGE_FREE) {
			if (!free)
				return -CKPT_E_NOSPC;
			free--;
		} else if (ckpt_cover_any(cs->mem.stages[si].cover, (u32)(in >> 9),
					  (u32)(n >> 9))) {
			return -CKPT_E_TWICE;
		}
		off += n;
		len -= n;
	}
	return 0;
}

static struct ckpt_stage_buf *ckpt_stage_take(struct ckpt_step *cs, u32 chunk)
{
	u32 i, si = cs->mem.stage_of[chunk];

	if (si != CKPT_STAGE_FREE)
		return &cs->mem.stages[si];
	for (i = 0; i < cs->mem.n_stages; i++) {
		if (cs->mem.stages[i].chunk == CKPT_STAGE_FREE) {
			cs->mem.stages[i].chunk = chunk;
			cs->mem.stage_of[chunk] = i;
			cs->free_stages--;
			return &cs->mem.stages[i];
		}
	}
	return NULL;	/* cannot happen: checked */
}

static int ckpt_step_claim(struct ckpt_step *cs, u32 chunk)
{
	int ret;

	cs->ops->lock(cs->host);
	ret = ckpt_sm_claim(&cs->sm, chunk);
	cs->ops->unlock(cs->host);
	return ret;
}

int ckpt_step_grad_write(struct ckpt_step *cs, u64 off, u64 len, void *src)
{
	const u64 cb = cs->chunk_bytes;
	u32 words = ckpt_bitmap_words(cs->sectors);
	int ret, err = 0;

	cs->ops->lock(cs->host);
	ret = __ckpt_grad_check(cs, off, len);
	if (ret)
		ckpt_sm_rejected(&cs->sm, ret);
	else
		cs->grad_bytes += len;
	cs->ops->unlock(cs->host);
	if (ret)
		return ret;

	cs->done_first = CKPT_STAGE_FREE;
	while (len && !err) {
		u32 chunk = (u32)(off >> cs->cb_shift);
		u64 in = off & (cb - 1);
		u64 n = len < cb - in ? len : cb - in;
		struct ckpt_stage_buf *s;

		if (n == cb) {
			err = ckpt_step_claim(cs, chunk);
			if (!err)
				err = cs->ops->dispatch(cs->host, src, chunk, NULL);
		} else {
			s = ckpt_stage_take(cs, chunk);
			if (!s) {	/* cannot happen: the check counted the stages */
				err = -CKPT_E_NOSPC;
				break;
			}
			cs->ops->copy(cs->host, src, s->grad + in, n);
			ckpt_cover_add(s->cover, cs->sectors, (u32)(in >> 9), (u32)(n >> 9));
			if (ckpt_cover_full(s->cover, cs->sectors)) {
				s->done_next = cs->done_first;
				cs->done_first = (u32)(s - cs->mem.stages);
				err = ckpt_step_claim(cs, chunk);
				if (!err)
					err = cs->ops->dispatch(cs->host, src, chunk, s->grad);
			}
		}
		off += n;
		len -= n;
	}
	if (cs->ops->dispatched) {
		ret = cs->ops->dispatched(cs->host, src);
		if (!err)
			err = ret;
	}
	/* The completed stages are free again. */
	while (cs->done_first != CKPT_STAGE_FREE) {
		struct ckpt_stage_buf *s = &cs->mem.stages[cs->done_first];

		cs->done_first = s->done_next;
		cs->mem.stage_of[s->chunk] = CKPT_STAGE_FREE;
		s->chunk = CKPT_STAGE_FREE;
		s->done_next = CKPT_STAGE_FREE;
		memset(s->cover, 0, words * sizeof(u64));
		cs->free_stages++;
	}
	return err;
}

int ckpt_sb_commit(const struct ckpt_step_ops *ops, void *host, struct ckpt_sb *sb,
		   struct ckpt_sb *spare, void *block, u64 step, u32 slot, const void *blob,
		   u32 blob_len, bool *issued)
{
	int ret;

	if (issued)
		*issued = false;
	if (ckpt_sb_next(sb, step, slot, blob, blob_len, spare))
		return -CKPT_EIO_ERRNO;
	/* Every write the superblock commits is complete; make them durable first. */
	ret = ops->flush(host);
	if (ret)
		return ret;
	memset(block, 0, CKPT_BLOCK);
	if (ckpt_sb_encode(spare, block))
		return -CKPT_EIO_ERRNO;
	if (issued)
		*issued = true;
	ret = ops->write_sb(host, block, ckpt_sb_next_offset(sb));
	if (ret)
		return ret;
	if (ops->read_sb) {
		const u32 crc = ckpt_crc32c(block, CKPT_BLOCK);

		ret = ops->read_sb(host, block, ckpt_sb_next_offset(sb));
		if (ret)
			return ret;
		if (ckpt_crc32c(block, CKPT_BLOCK) != crc)
			return -CKPT_EIO_ERRNO;
	}
	*sb = *spare;
	return 0;
}

/*
 * A superblock write failed with io: the machine enters FAILED, and the host
 * hears of it once (ops->failed), however many commits fail.
 */
static void ckpt_step_sb_failed(struct ckpt_step *cs, int io)
{
	bool entered;

	cs->ops->lock(cs->host);
	entered = cs->sm.state != CKPT_STATE_FAILED;
	if (entered)
		ckpt_sm_commit_failed(&cs->sm, io);
	cs->ops->unlock(cs->host);
	if (entered && cs->ops->failed)
		cs->ops->failed(cs->host, io);
}

int ckpt_step_write_sb(struct ckpt_step *cs, u64 step, u32 slot, const void *blob,
		       u32 blob_len)
{
	bool issued;
	int ret = ckpt_sb_commit(cs->ops, cs->host, cs->sb, cs->mem.spare, cs->mem.block, step,
				 slot, blob, blob_len, &issued);

	/*
	 * Once the write is issued, a failure says nothing of what the device
	 * holds (a write it kept, a read-back that failed): it may name the
	 * new commit, whose slot the machine takes for free. Going on from
	 * *cs->sb could overwrite the committed state; only a reload that
	 * reads the device again knows which commit stands.
	 */
	if (ret && issued)
		ckpt_step_sb_failed(cs, ret);
	return ret;
}

/*
 * BEGIN: check under the sm lock, clear the bitmaps without it (nothing reads
 * them outside an open step, and the command lock keeps other commands and
 * claims out), then check again and open the step under it.
 */
static int ckpt_step_begin(struct ckpt_step *cs, const struct ckpt_cmd *cmd)
{
	const struct ckpt_step_ops *ops = cs->ops;
	u32 dst;
	int ret;

	ops->lock(cs->host);
	ret = ckpt_sm_begin_check(&cs->sm, cmd);
	if (ret)
		ckpt_sm_rejected(&cs->sm, ret);
	ops->unlock(cs->host);
	if (ret)
		return ret;

	ckpt_sm_clear_bitmaps(&cs->sm, cs->mem.claimed, cs->mem.applied);
	if (cs->mem.modes)
		memset(cs->mem.modes, 0, ckpt_step_blocks(&cs->layout));
	cs->n_bias = 0;

	ops->lock(cs->host);
	ret = ckpt_sm_begin_check(&cs->sm, cmd);
	if (ret)
		ckpt_sm_rejected(&cs->sm, ret);
	else
		ckpt_sm_begin_open(&cs->sm, cmd);
	dst = ckpt_sm_dst_slot(&cs->sm);
	ops->unlock(cs->host);
	if (ret)
		return ret;
	if (ops->quiesce)
		ops->quiesce(cs->host, dst);
	return 0;
}

/* ---------------- block counts: RANGE and the update's runs ---------------- */

static bool ckpt_counts(const struct ckpt_step *cs)
{
	return cs->sb->feature_incompat & CKPT_FEATURE_INCOMPAT_COUNTS;
}

/* Blocks per chunk, as a shift. */
static u32 ckpt_bpc_shift(const struct ckpt_step *cs)
{
	return cs->sb->geo.chunk_shift - CKPT_BLOCK_SHIFT;
}

/* Every range of a RANGE command, before anything changes. */
static int ckpt_range_check(const struct ckpt_step *cs, const struct ckpt_cmd *cmd)
{
	const u64 window = cs->layout.window_bytes;
	const u32 bpc = ckpt_bpc_shift(cs);
	u32 i, k, n_bias = cs->n_bias;

	for (i = 0; i < cmd->n_ranges; i++) {
		const struct ckpt_range *r = &cmd->ranges[i];
		u64 b, first = r->off >> (CKPT_BLOCK_SHIFT + 1), end;

		if (r->flags & ~CKPT_RANGE_SKIP)
			return -CKPT_E_INVAL;
		if ((r->off | r->len) & (CKPT_BLOCK - 1))
			return -CKPT_E_ALIGN;
		if (!r->len || r->off >= window || r->len > window - r->off)
			return -CKPT_E_RANGE;
		end = first + (r->len >> (CKPT_BLOCK_SHIFT + 1));
		for (k = 0; k < i; k++) {	/* no block twice in one command */
			const struct ckpt_range *o = &cmd->ranges[k];

			if (r->off < o->off + o->len && o->off < r->off + r->len)
				return -CKPT_E_TWICE;
		}
		if (!(r->flags & CKPT_RANGE_SKIP)) {
			struct ckpt_hparams h = cs->sm.groups[0];

			/* a block's count reaches at most the open step */
			if (!r->count || r->count > cs->sm.open_step)
				return -CKPT_E_STEP;
			h.step_size = r->step_size;
			h.bc2_sqrt = r->bc2_sqrt;
			if (ckpt_hparams_check(&h, NULL))
				return -CKPT_E_HPARAM;
			if (n_bias++ >= CKPT_BIAS_MAX)
				return -CKPT_E_NOSPC;
		}
		for (b = first; b < end; b++)
			if (cs->mem.modes[b] || ckpt_bit_test(cs->sm.claimed, (u32)(b >> bpc)))
				return -CKPT_E_TWICE;
	}
	return 0;
}

/*
 * RANGE: no drain (it changes no update in flight: a block it names must
 * not be claimed yet). The claimed bitmap changes only under the command
 * lock, which the caller holds, so the blocks are checked unlocked.
 */
static int ckpt_step_range(struct ckpt_step *cs, const struct ckpt_cmd *cmd)
{
	u32 i;
	int ret = 0;

	cs->ops->lock(cs->host);
	if (cs->sm.state == CKPT_STATE_FAILED)
		ret = -CKPT_E_FAILED;
	else if (cs->sm.state != CKPT_STATE_OPEN)
		ret = -CKPT_E_STATE;
	else if (cmd->step != cs->sm.open_step)
		ret = -CKPT_E_STEP;
	else if (!ckpt_counts(cs) || !cs->mem.modes)
		ret = -CKPT_E_FEATURE;
	cs->ops->unlock(cs->host);
	if (!ret)
		ret = ckpt_range_check(cs, cmd);
	if (ret) {
		cs->ops->lock(cs->host);
		ckpt_sm_rejected(&cs->sm, ret);
		cs->ops->unlock(cs->host);
		return ret;
	}
	for (i = 0; i < cmd->n_ranges; i++) {
		const struct ckpt_range *r = &cmd->ranges[i];
		u8 mode = CKPT_MODE_SKIP;

		if (!(r->flags & CKPT_RANGE_SKIP)) {
			cs->bias[cs->n_bias].count = r->count;
			cs->bias[cs->n_bias].step_size = r->step_size;
			cs->bias[cs->n_bias].bc2_sqrt = r->bc2_sqrt;
			mode = (u8)(++cs->n_bias);
		}
		memset(cs->mem.modes + (r->off >> (CKPT_BLOCK_SHIFT + 1)), mode,
		       r->len >> (CKPT_BLOCK_SHIFT + 1));
	}
	return 0;
}

static u8 ckpt_block_mode(const struct ckpt_step *cs, u32 chunk, u32 block)
{
	if (!cs->mem.modes || !ckpt_counts(cs))
		return 0;
	return cs->mem.modes[((u64)chunk << ckpt_bpc_shift(cs)) + block];
}

bool ckpt_step_run(const struct ckpt_step *cs, u32 chunk, u32 group, u64 *pos,
		   struct ckpt_run *run)
{
	const u32 blocks = 1u << ckpt_bpc_shift(cs);
	u32 b = (u32)*pos, e;
	u8 mode;

	if (b >= blocks)
		return false;
	mode = ckpt_block_mode(cs, chunk, b);
	for (e = b + 1; e < blocks && ckpt_block_mode(cs, chunk, e) == mode; e++)
		;
	*pos = e;
	run->first = (u64)b << CKPT_BLOCK_SHIFT;
	run->n = (u64)(e - b) << CKPT_BLOCK_SHIFT;
	run->skip = mode == CKPT_MODE_SKIP;
	run->hp = cs->sm.groups[group];
	if (mode && !run->skip) {
		run->hp.step_size = cs->bias[mode - 1].step_size;
		run->hp.bc2_sqrt = cs->bias[mode - 1].bc2_sqrt;
	}
	return true;
}

int ckpt_step_counts(const struct ckpt_step *cs, u32 chunk, void *header)
{
	const u32 blocks = 1u << ckpt_bpc_shift(cs);
	u32 b;

	if (!ckpt_counts(cs))
		return 0;
	for (b = 0; b < blocks; b++) {
		u8 mode = ckpt_block_mode(cs, chunk, b);
		u64 want = mode ? cs->bias[mode - 1].count : cs->sm.open_step;

		if (mode != CKPT_MODE_SKIP && ckpt_rec_count(header, b) + 1 != want)
			return -CKPT_E_STEP;
	}
	for (b = 0; b < blocks; b++)
		if (ckpt_block_mode(cs, chunk, b) != CKPT_MODE_SKIP)
			ckpt_rec_set_count(header, b, ckpt_rec_count(header, b) + 1);
	return 0;
}

void ckpt_round_params_int(u32 dtype, const u32 *p, u16 *plo, u64 n)
{
	u64 i;

	for (i = 0; i < n; i++)
		plo[i] = dtype == CKPT_DTYPE_BF16 ? ckpt_f32_to_bf16_int(p[i])
						  : ckpt_f32_to_f16_int(p[i]);
}

/*
 * ROLLBACK: the host's rollback (ckpt_step_ops rollback), which checks by
 * ckpt_step_rollback_check; a refusal is recorded here, as every command's.
 */
static int ckpt_step_rollback(struct ckpt_step *cs, const struct ckpt_cmd *cmd, int *io_errno)
{
	int ret = -CKPT_E_OPCODE, io = 0;

	if (cs->ops->rollback)
		ret = cs->ops->rollback(cs->host, cmd->step, &io);
	if (ret == -CKPT_E_IO) {
		if (io_errno)
			*io_errno = io;
		return ret;
	}
	if (ret < 0) {
		cs->ops->lock(cs->host);
		ckpt_sm_rejected(&cs->sm, ret);
		cs->ops->unlock(cs->host);
		return ret;
	}
	return 0;
}

int ckpt_step_exec(struct ckpt_step *cs, const struct ckpt_cmd *cmd, int *io_errno)
{
	const struct ckpt_step_ops *ops = cs->ops;
	u64 step = 0, sumsq = 0;
	u32 slot = 0;
	int ret, io;

	if (cmd->opcode == CKPT_OP_RANGE)
		return ckpt_step_range(cs, cmd);
	/* Everything dispatched before the command is on the device first. */
	if (ops->drain)
		ops->drain(cs->host);
	if (cmd->opcode == CKPT_OP_BEGIN)
		return ckpt_step_begin(cs, cmd);
	if (cmd->opcode == CKPT_OP_ROLLBACK)
		return ckpt_step_rollback(cs, cmd, io_errno);
	/*
	 * The step's gradient sum, in chunk order, before the lock (the updates
	 * are drained: the chunks' sums stand); used only if COMMIT ends the step.
	 */
	if (cmd->opcode == CKPT_OP_COMMIT && cs->mem.sumsq) {
		if (ops->fpu_begin)
			ops->fpu_begin(cs->host);
		sumsq = ckpt_sum_f64(cs->mem.sumsq, cs->sm.n_chunks);
		if (ops->fpu_end)
			ops->fpu_end(cs->host);
	}
	ops->lock(cs->host);
	switch (cmd->opcode) {
	case CKPT_OP_ABORT:
		ret = ckpt_sm_abort(&cs->sm, cmd);
		break;
	case CKPT_OP_COMMIT:
		ret = ckpt_sm_commit(&cs->sm, cmd);
		step = cs->sm.open_step;
		slot = ckpt_sm_dst_slot(&cs->sm);
		if (ret >= 0 && cs->mem.sumsq) {
			cs->sm.grad_sumsq = sumsq;
			cs->sm.grad_sumsq_step = step;
		}
		break;
	default:
		ret = -CKPT_E_OPCODE;
		break;
	}
	if (ret < 0)
		ckpt_sm_rejected(&cs->sm, ret);
	ops->unlock(cs->host);
	if (ret < 0)
		return ret;

	if (cmd->opcode == CKPT_OP_ABORT || ret == CKPT_RESULT_OVERFLOW) {
		ckpt_step_release_stages(cs);
	} else if (ret == CKPT_RESULT_COMMITTED) {
		io = ckpt_step_write_sb(cs, step, slot, cmd->blob, cmd->blob_len);
		if (io) {
			/* even before the superblock write: the step cannot commit */
			ckpt_step_sb_failed(cs, io);
			if (io_errno)
				*io_errno = io;
			return -CKPT_E_IO;
		}
		ops->lock(cs->host);
		ckpt_sm_committed(&cs->sm);
		ops->unlock(cs->host);
		ckpt_step_release_stages(cs);
	}
	return ret;
}

int ckpt_step_command(struct ckpt_step *cs, const void *buf, u32 len)
{
	int ret = ckpt_cmd_decode(buf, len, cs->mem.cmd);

	if (ret < 0) {
		cs->ops->lock(cs->host);
		ckpt_sm_rejected(&cs->sm, ret);
		cs->ops->unlock(cs->host);
		return ret;
	}
	return ckpt_step_exec(cs, cs->mem.cmd, NULL);
}

/* ---------------- the virtual device's windows ---------------- */

int ckpt_route(const struct ckpt_layout *l, u64 off, u64 len, u32 flags, struct ckpt_route *r)
{
	const bool write = flags & CKPT_ROUTE_WRITE;
	u64 end = 0;

	memset(r, 0, sizeof(*r));
	if (!len)
		return 0;
	if (off < l->virt_bytes) {
		if (off < l->grad_off) {
			r->window = CKPT_WIN_CTRL;
			r->off = off;
			end = l->grad_off;
		} else if (off < l->param_off) {
			r->window = CKPT_WIN_GRAD;
			r->off = off - l->grad_off;
			end = l->param_off;
		} else {
			/* p_lo chunks are a power of two: a shift, no 64-bit division */
			r->window = CKPT_WIN_PARAM;
			r->off = off - l->param_off;
			r->chunk = (u32)(r->off >> __builtin_ctzll(l->plo_chunk_bytes));
			r->in = r->off & (l->plo_chunk_bytes - 1);
			end = off - r->in + l->plo_chunk_bytes;
		}
	}
	if (write && ((off | len) & (CKPT_SECTOR - 1)))
		return -CKPT_E_ALIGN;
	/* Written so that off + len cannot wrap. */
	if (off >= l->virt_bytes || len > l->virt_bytes - off) {
		r->window = CKPT_WIN_NONE;
		r->off = 0;
		r->chunk = 0;
		r->in = 0;
		return -CKPT_E_RANGE;
	}
	if (!write) {
		r->len = len < end - off ? len : end - off;
		return 0;
	}
	if (flags & CKPT_ROUTE_READ_ONLY)
		return -CKPT_E_READONLY;
	switch (r->window) {
	case CKPT_WIN_CTRL:
		if (off || len > CKPT_BLOCK)
			return -CKPT_E_RANGE;
		break;
	case CKPT_WIN_GRAD:
		if (len > l->param_off - off)
			return -CKPT_E_RANGE;
		break;
	default:
		return -CKPT_E_READONLY;
	}
	r->len = len;
	return 0;
}

int ckpt_step_route(struct ckpt_step *cs, u64 off, u64 len, u32 flags, struct ckpt_route *r)
{
	int ret = ckpt_route(&cs->layout, off, len, flags, r);

	if (ret && (flags & CKPT_ROUTE_WRITE)) {
		cs->ops->lock(cs->host);
		ckpt_sm_rejected(&cs->sm, ret);
		cs->ops->unlock(cs->host);
	}
	return ret;
}

/* ---------------- loading state ---------------- */

int ckpt_step_load_check(struct ckpt_step *cs, u64 step, u64 blob_len)
{
	int ret = 0;

	cs->ops->lock(cs->host);
	if (cs->sm.state == CKPT_STATE_FAILED)
		ret = -CKPT_E_FAILED;
	else if (cs->sm.state != CKPT_STATE_IDLE || cs->sm.committed_step)
		ret = -CKPT_E_STATE;
	cs->ops->unlock(cs->host);
	if (ret)
		return ret;
	if (step > CKPT_STEP_MAX)
		return -CKPT_E_STEP;
	if (blob_len > CKPT_BLOB_MAX)
		return -CKPT_E_BLOB;
	return 0;
}

int ckpt_step_load_span(const struct ckpt_step *cs, u64 offset, u64 n)
{
	const u64 n_params = cs->layout.n_params;

	if (offset >= n_params || n > n_params - offset)
		return -CKPT_E_RANGE;
	return 0;
}

int ckpt_step_load_commit(struct ckpt_step *cs, u64 step, const void *blob, u32 blob_len)
{
	u32 slot;
	int ret;

	cs->ops->lock(cs->host);
	slot = ckpt_sm_dst_slot(&cs->sm);
	cs->ops->unlock(cs->host);
	ret = ckpt_step_write_sb(cs, step, slot, blob, blob_len);
	if (ret)
		return ret;
	ckpt_step_restart(cs);
	return 0;
}

/* ---------------- rollback ---------------- */

int ckpt_step_rollback_check(struct ckpt_step *cs, const struct ckpt_sb *prev, u64 step)
{
	const struct ckpt_sb *sb = cs->sb;
	int ret = 0;

	cs->ops->lock(cs->host);
	if (cs->sm.state == CKPT_STATE_FAILED)
		ret = -CKPT_E_FAILED;
	else if (cs->sm.state != CKPT_STATE_IDLE)
		ret = -CKPT_E_STATE;
	else if (step && step != cs->sm.committed_step)
		ret = -CKPT_E_STEP;
	cs->ops->unlock(cs->host);
	if (ret)
		return ret;
	if (!sb->committed_step || !prev || prev->sequence + 1 != sb->sequence ||
	    prev->committed_step + 1 != sb->committed_step ||
	    prev->committed_slot != (sb->committed_slot ^ 1) ||
	    memcmp(prev->uuid, sb->uuid, sizeof(sb->uuid)) ||
	    memcmp(&prev->geo, &sb->geo, sizeof(sb->geo)) ||
	    prev->manifest_crc != sb->manifest_crc ||
	    prev->feature_incompat != sb->feature_incompat)
		return -CKPT_E_ROLLBACK;
	return 0;
}

int ckpt_step_rollback_rec(const struct ckpt_step *cs, const struct ckpt_sb *prev, u32 chunk,
			   void *header, const void *data, const void *plo)
{
	const u32 incompat = cs->sb->feature_incompat;
	struct ckpt_rec want, id, got;
	enum ckpt_rec_fault f;

	if (chunk >= cs->sb->geo.n_chunks)
		return -CKPT_E_RANGE;
	ckpt_rec_committed(prev, chunk, &want);
	ckpt_rec_next(cs->sb, chunk, prev->committed_step, &id);
	f = ckpt_rec_check(header, data, plo, &want, incompat, &got);
	if (f == CKPT_REC_STEP && got.step == id.step && got.sequence == id.sequence)
		/* re-stamped by an interrupted rollback: check the rest of it */
		return ckpt_rec_check(header, data, plo, &id, incompat, &got) ? -CKPT_E_ROLLBACK : 0;
	if (f != CKPT_REC_OK)
		return -CKPT_E_ROLLBACK;
	id.data_crc = got.data_crc;
	id.plo_crc = got.plo_crc;
	ckpt_rec_seal(header, NULL, NULL, &id, incompat);
	return 1;
}

int ckpt_step_rollback_commit(struct ckpt_step *cs, const struct ckpt_sb *prev)
{
	int ret = ckpt_step_write_sb(cs, prev->committed_step, prev->committed_slot, prev->blob,
				     prev->blob_len);

	if (ret)
		return ret;
	/* IDLE before and after: no stage, no bitmap in use */
	cs->ops->lock(cs->host);
	cs->sm.committed_step = cs->sb->committed_step;
	cs->sm.committed_slot = cs->sb->committed_slot & 1;
	cs->sm.last_result = CKPT_RESULT_NONE;
	cs->sm.last_error = CKPT_OK;
	cs->ops->unlock(cs->host);
	return 0;
}
