// SPDX-License-Identifier: GPL-2.0
/* bdev_nr_bytes() (5.16) to size the backing device. */
#include <linux/module.h>
#include <linux/blkdev.h>

loff_t probe(struct block_device *b);
loff_t probe(struct block_device *b)
{
	return bdev_nr_bytes(b);
}
MODULE_LICENSE("GPL");
