// SPDX-License-Identifier: GPL-2.0
/* dm_get_device() takes a blk_mode_t (6.5) instead of an fmode_t. */
#include <linux/module.h>
#include <linux/device-mapper.h>

int probe(struct dm_target *ti, struct dm_dev **d);
int probe(struct dm_target *ti, struct dm_dev **d)
{
	blk_mode_t mode = dm_table_get_mode(ti->table);

	return dm_get_device(ti, "x", mode, d);
}
MODULE_LICENSE("GPL");
