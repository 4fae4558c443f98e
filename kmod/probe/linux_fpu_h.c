// SPDX-License-Identifier: GPL-2.0
/* <linux/fpu.h> (6.10) instead of <asm/fpu/api.h>. */
#include <linux/module.h>
#include <linux/fpu.h>

void probe(void);
void probe(void)
{
	kernel_fpu_begin();
	kernel_fpu_end();
}
MODULE_LICENSE("GPL");
