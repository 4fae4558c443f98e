/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * The kernel target's table line, parsed where a userspace fuzzer and unit
 * tests reach it too:
 *
 *   ckpt <backing_dev> [#opt_args] [queue_depth N] [staging_kb K]
 *
 * The optional arguments are "<name> <value>" pairs, each at most once, in
 * any order; STATUSTYPE_TABLE echoes them in the order given. Pure parsing:
 * no allocation, no lookup of the device.
 */
#ifndef CKPT_TABLE_H
#define CKPT_TABLE_H

#include "ckpt_platform.h"
#include "ckpt_step.h"

#ifdef __cplusplus
extern "C" {
#endif

enum ckpt_table_opt {
	CKPT_TABLE_QUEUE_DEPTH,
	CKPT_TABLE_STAGING_KB,
	CKPT_TABLE_OPTS_N,
};

#define CKPT_DEFAULT_QUEUE_DEPTH	8u
#define CKPT_MAX_QUEUE_DEPTH		128u
#define CKPT_DEFAULT_STAGING_KB		((u32)(CKPT_STAGING_DEFAULT >> 10))
#define CKPT_MAX_STAGING_KB		(4u << 20)

struct ckpt_table_args {
	const char *dev;		/* argv[0]: valid only while argv is */
	u32 queue_depth;		/* the defaults where not given */
	u32 staging_kb;
	u32 n_opts;			/* pairs given */
	u32 order[CKPT_TABLE_OPTS_N];	/* enum ckpt_table_opt, in the order given */
};

/*
 * Parse the argc strings of argv (the table line after the target name;
 * each NUL-terminated, argv[0] the backing device). Numbers are decimal
 * digits only, at least one, within u32. Returns 0, or -CKPT_E_INVAL with
 * *error a message for ti->error naming what is wrong; a is written only on
 * success.
 */
int ckpt_table_parse(u32 argc, char *const *argv, struct ckpt_table_args *a,
		     const char **error);

/* The table name of option i ("queue_depth"), NULL past the list. */
const char *ckpt_table_opt_name(u32 i);
/* The value of option i in a (0 past the list). */
u32 ckpt_table_opt_value(const struct ckpt_table_args *a, u32 i);

#ifdef __cplusplus
}
#endif

#endif /* CKPT_TABLE_H */
