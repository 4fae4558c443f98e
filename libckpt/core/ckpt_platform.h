/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * What the portable core needs from its host, and nothing more: fixed-width
 * types, little-endian conversion and crc32c. The core is compiled unchanged
 * into dm-ckpt.ko and into libckpt, so it uses no libc beyond the builtins
 * both worlds provide.
 */
#ifndef CKPT_PLATFORM_H
#define CKPT_PLATFORM_H

#ifdef __KERNEL__
#include <linux/kernel.h>
#include <linux/types.h>
#include <linux/string.h>
#include <linux/crc32c.h>
#include <linux/errno.h>
#include <asm/byteorder.h>

/*
 * crc32c-intel keeps preemption off (kernel_fpu_begin) for the whole buffer
 * of a call: 48 MiB records, 8 MiB p_lo chunks and 16 MiB group tables would
 * keep it off for milliseconds. Slices bound each section.
 */
#define CKPT_CRC_SLICE	(64u << 10)

static inline u32 ckpt_crc32c_raw(u32 seed, const void *p, size_t len)
{
	const u8 *b = p;

	while (len > CKPT_CRC_SLICE) {
		seed = crc32c(seed, b, CKPT_CRC_SLICE);
		b += CKPT_CRC_SLICE;
		len -= CKPT_CRC_SLICE;
	}
	return crc32c(seed, b, len);
}

#else /* userspace */
#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>
#include <string.h> /* memcpy/memset only: the compiler inlines them */

#include <linux/types.h>	/* __le16, __le32, __le64 */
#include <linux/errno.h>	/* the errno column of CKPT_ERRORS */

/* The kernel's names; x86_64 Linux only, where these are uint8_t... int64_t. */
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long u64;
typedef int s32;
typedef long s64;

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "dm-ckpt userspace: only little-endian hosts are supported"
#endif
#define cpu_to_le16(x) ((__le16)(x))
#define cpu_to_le32(x) ((__le32)(x))
#define cpu_to_le64(x) ((__le64)(x))
#define le16_to_cpu(x) ((u16)(x))
#define le32_to_cpu(x) ((u32)(x))
#define le64_to_cpu(x) ((u64)(x))

#ifndef ARRAY_SIZE
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#endif
#ifndef __packed
#define __packed __attribute__((packed))
#endif
#ifndef __always_inline		/* glibc's sys/cdefs.h has one */
#define __always_inline inline __attribute__((always_inline))
#endif

#ifdef __cplusplus
extern "C" {
#endif
/* Castagnoli CRC without pre/post inversion, as the kernel's crc32c(). */
u32 ckpt_crc32c_raw(u32 seed, const void *p, size_t len);
#ifdef __cplusplus
}
#endif
#endif /* __KERNEL__ */

/* The standard crc32c (initial ~0, final inversion) used by every on-disk checksum. */
static inline u32 ckpt_crc32c(const void *p, size_t len)
{
	return ~ckpt_crc32c_raw(~0u, p, len);
}

#endif /* CKPT_PLATFORM_H */
