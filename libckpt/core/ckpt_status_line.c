// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * The dm status INFO line: printed from the counters, and parsed strictly,
 * naming the first bad field (ckpt_status_line, ckpt_status_line_parse_at).
 *
 * No I/O, no allocation, no float (fp32 values are checked as bit patterns).
 */
#include "ckpt_step_impl.h"

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
