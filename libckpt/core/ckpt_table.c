// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * The kernel target's table line (ckpt_table.h). It lives in the core so
 * that the userspace build can test and fuzz what the constructor parses.
 */
#include "ckpt_table.h"

static const struct ckpt_table_opt_desc {
	const char *name;
	u32 off;	/* of its value in struct ckpt_table_args */
	u32 min, max, dflt;
	const char *err_dup, *err_missing, *err_nan, *err_range;
} ckpt_table_opts[CKPT_TABLE_OPTS_N] = {
	[CKPT_TABLE_QUEUE_DEPTH] = {
		"queue_depth", offsetof(struct ckpt_table_args, queue_depth),
		1, CKPT_MAX_QUEUE_DEPTH, CKPT_DEFAULT_QUEUE_DEPTH,
		"Duplicate queue_depth argument", "queue_depth needs a value",
		"Invalid queue_depth (not a number)", "queue_depth out of range (1..128)" },
	[CKPT_TABLE_STAGING_KB] = {
		"staging_kb", offsetof(struct ckpt_table_args, staging_kb),
		1, CKPT_MAX_STAGING_KB, CKPT_DEFAULT_STAGING_KB,
		"Duplicate staging_kb argument", "staging_kb needs a value",
		"Invalid staging_kb (not a number)", "staging_kb out of range (1..4194304)" },
};

const char *ckpt_table_opt_name(u32 i)
{
	return i < CKPT_TABLE_OPTS_N ? ckpt_table_opts[i].name : NULL;
}

u32 ckpt_table_opt_value(const struct ckpt_table_args *a, u32 i)
{
	u32 v = 0;

	if (i < CKPT_TABLE_OPTS_N)
		memcpy(&v, (const u8 *)a + ckpt_table_opts[i].off, sizeof(v));
	return v;
}

static void ckpt_table_set(struct ckpt_table_args *a, u32 i, u32 v)
{
	memcpy((u8 *)a + ckpt_table_opts[i].off, &v, sizeof(v));
}

/* Decimal digits only (no sign, no blank), at least one, within u32. */
static bool ckpt_table_u32(const char *s, u32 *out)
{
	u64 v = 0;

	if (!*s)
		return false;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return false;
		v = v * 10 + (u32)(*s - '0');
		if (v > 0xffffffffULL)
			return false;
	}
	*out = (u32)v;
	return true;
}

/* ASCII case-insensitive equality, as the kernel's strcasecmp() == 0. */
static bool ckpt_table_name_eq(const char *a, const char *b)
{
	for (; *a && *b; a++, b++) {
		char x = *a >= 'A' && *a <= 'Z' ? *a - 'A' + 'a' : *a;
		char y = *b >= 'A' && *b <= 'Z' ? *b - 'A' + 'a' : *b;

		if (x != y)
			return false;
	}
	return *a == *b;
}

int ckpt_table_parse(u32 argc, char *const *argv, struct ckpt_table_args *a,
		     const char **error)
{
	const struct ckpt_table_opt_desc *o;
	struct ckpt_table_args r;
	u32 n, v, i, pos = 2;
	bool seen[CKPT_TABLE_OPTS_N] = { false };

	if (argc < 1) {
		*error = "Invalid argument count: ckpt <dev> [#opts] [queue_depth N] [staging_kb K]";
		return -CKPT_E_INVAL;
	}
	memset(&r, 0, sizeof(r));
	r.dev = argv[0];
	for (i = 0; i < CKPT_TABLE_OPTS_N; i++)
		ckpt_table_set(&r, i, ckpt_table_opts[i].dflt);
	if (argc > 1) {
		/* The count and the arguments it covers, as dm_read_arg_group. */
		if (!ckpt_table_u32(argv[1], &n) || n > 2 * CKPT_TABLE_OPTS_N || n > argc - 2) {
			*error = "Invalid number of optional arguments (0, 2 or 4)";
			return -CKPT_E_INVAL;
		}
		while (n) {
			const char *name = argv[pos++];

			n--;
			for (i = 0; i < CKPT_TABLE_OPTS_N; i++)
				if (ckpt_table_name_eq(name, ckpt_table_opts[i].name))
					break;
			if (i == CKPT_TABLE_OPTS_N) {
				*error = "Unknown optional argument";
				return -CKPT_E_INVAL;
			}
			o = &ckpt_table_opts[i];
			if (seen[i]) {
				*error = o->err_dup;
				return -CKPT_E_INVAL;
			}
			if (!n) {
				*error = o->err_missing;
				return -CKPT_E_INVAL;
			}
			n--;
			if (!ckpt_table_u32(argv[pos++], &v)) {
				*error = o->err_nan;
				return -CKPT_E_INVAL;
			}
			if (v < o->min || v > o->max) {
				*error = o->err_range;
				return -CKPT_E_INVAL;
			}
			ckpt_table_set(&r, i, v);
			seen[i] = true;
			r.order[r.n_opts++] = i;
		}
		if (pos != argc) {
			*error = "Too many arguments";
			return -CKPT_E_INVAL;
		}
	}
	*a = r;
	return 0;
}
