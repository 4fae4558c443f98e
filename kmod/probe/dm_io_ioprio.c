// SPDX-License-Identifier: GPL-2.0
/* dm_io() takes an I/O priority (6.9; Debian backported it to 6.1.83+). */
#include <linux/module.h>
#include <linux/dm-io.h>
#include <linux/ioprio.h>

int probe(struct dm_io_request *r, struct dm_io_region *w, unsigned long *e);
int probe(struct dm_io_request *r, struct dm_io_region *w, unsigned long *e)
{
	return dm_io(r, 1, w, e, IOPRIO_DEFAULT);
}
MODULE_LICENSE("GPL");
