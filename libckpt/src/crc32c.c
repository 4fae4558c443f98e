// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * crc32c (Castagnoli) for the userspace build of the core, with the kernel's
 * crc32c() semantics: reflected polynomial 0x82F63B78, the seed is the
 * running crc as is, no pre- or post-inversion (ckpt_crc32c() adds those).
 *
 * ISA-L's crc32_iscsi where the build has it (CKPT_HAVE_ISAL: every native
 * build; scripts/deps.sh installs libisal-dev). It picks its own code for
 * the CPU at load time; on x86-64 it folds with PCLMULQDQ at about 50 GB/s
 * on one core here, where one chain of crc32 instructions gives 8: every
 * record of p, m and v a step reads is checked and every one it writes is
 * summed, so at the single chain's speed the checksum cost the engine
 * several times what the update loop does.
 *
 * Without ISA-L (the aarch64 cross build: libisal-dev is not Multi-Arch:
 * same in Debian 12) the SSE4.2 crc32 instruction (x86-64) or the ARMv8
 * CRC32 extension (aarch64) when the CPU has it (chosen once at load time),
 * otherwise slicing-by-8 tables. All give identical results; the unit tests
 * compare them on random data of many lengths and alignments.
 */
#include "ckpt_platform.h"

#include <pthread.h>

#ifdef CKPT_HAVE_ISAL
#include <isa-l/crc.h>
#endif

/* Also used by the tests, which declare them themselves. */
u32 ckpt_crc32c_sw(u32 seed, const void *p, size_t len);
u32 ckpt_crc32c_hw(u32 seed, const void *p, size_t len);
int ckpt_crc32c_hw_available(void);

#define CKPT_CRC32C_POLY 0x82F63B78u

static u32 crc_tab[8][256];
static pthread_once_t crc_tab_once = PTHREAD_ONCE_INIT;

static void crc_tab_init(void)
{
	u32 i, j, c;

	for (i = 0; i < 256; i++) {
		c = i;
		for (j = 0; j < 8; j++)
			c = (c >> 1) ^ (CKPT_CRC32C_POLY & (0u - (c & 1)));
		crc_tab[0][i] = c;
	}
	for (i = 0; i < 256; i++) {
		c = crc_tab[0][i];
		for (j = 1; j < 8; j++) {
			c = (c >> 8) ^ crc_tab[0][c & 0xff];
			crc_tab[j][i] = c;
		}
	}
}

static inline u64 load_le64(const unsigned char *p)
{
	u64 v;

	memcpy(&v, p, sizeof(v));	/* little-endian host only */
	return v;
}

u32 ckpt_crc32c_sw(u32 crc, const void *buf, size_t len)
{
	const unsigned char *p = buf;

	pthread_once(&crc_tab_once, crc_tab_init);
	while (len && ((uintptr_t)p & 7)) {
		crc = (crc >> 8) ^ crc_tab[0][(crc ^ *p++) & 0xff];
		len--;
	}
	while (len >= 8) {
		u64 v = load_le64(p) ^ crc;

		crc = crc_tab[7][v & 0xff] ^
		      crc_tab[6][(v >> 8) & 0xff] ^
		      crc_tab[5][(v >> 16) & 0xff] ^
		      crc_tab[4][(v >> 24) & 0xff] ^
		      crc_tab[3][(v >> 32) & 0xff] ^
		      crc_tab[2][(v >> 40) & 0xff] ^
		      crc_tab[1][(v >> 48) & 0xff] ^
		      crc_tab[0][v >> 56];
		p += 8;
		len -= 8;
	}
	while (len--)
		crc = (crc >> 8) ^ crc_tab[0][(crc ^ *p++) & 0xff];
	return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2")))
u32 ckpt_crc32c_hw(u32 crc, const void *buf, size_t len)
{
	const unsigned char *p = buf;
	u64 c = crc;

	while (len && ((uintptr_t)p & 7)) {
		c = __builtin_ia32_crc32qi((u32)c, *p++);
		len--;
	}
	while (len >= 32) {
		c = __builtin_ia32_crc32di(c, load_le64(p));
		c = __builtin_ia32_crc32di(c, load_le64(p + 8));
		c = __builtin_ia32_crc32di(c, load_le64(p + 16));
		c = __builtin_ia32_crc32di(c, load_le64(p + 24));
		p += 32;
		len -= 32;
	}
	while (len >= 8) {
		c = __builtin_ia32_crc32di(c, load_le64(p));
		p += 8;
		len -= 8;
	}
	while (len--)
		c = __builtin_ia32_crc32qi((u32)c, *p++);
	return (u32)c;
}

int ckpt_crc32c_hw_available(void)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("sse4.2") ? 1 : 0;
}
#elif defined(__aarch64__)
#include <sys/auxv.h>

__attribute__((target("+crc")))
u32 ckpt_crc32c_hw(u32 crc, const void *buf, size_t len)
{
	const unsigned char *p = buf;

	while (len && ((uintptr_t)p & 7)) {
		crc = __builtin_aarch64_crc32cb(crc, *p++);
		len--;
	}
	while (len >= 32) {
		crc = __builtin_aarch64_crc32cx(crc, load_le64(p));
		crc = __builtin_aarch64_crc32cx(crc, load_le64(p + 8));
		crc = __builtin_aarch64_crc32cx(crc, load_le64(p + 16));
		crc = __builtin_aarch64_crc32cx(crc, load_le64(p + 24));
		p += 32;
		len -= 32;
	}
	while (len >= 8) {
		crc = __builtin_aarch64_crc32cx(crc, load_le64(p));
		p += 8;
		len -= 8;
	}
	while (len--)
		crc = __builtin_aarch64_crc32cb(crc, *p++);
	return crc;
}

int ckpt_crc32c_hw_available(void)
{
	return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
}
#else
u32 ckpt_crc32c_hw(u32 crc, const void *buf, size_t len)
{
	return ckpt_crc32c_sw(crc, buf, len);
}

int ckpt_crc32c_hw_available(void)
{
	return 0;
}
#endif

#ifdef CKPT_HAVE_ISAL
/* ISA-L dispatches by itself. crc32_iscsi takes an int length: whole buffers
 * go in 1 GiB pieces. */
u32 ckpt_crc32c_raw(u32 crc, const void *buf, size_t len)
{
	const unsigned char *p = buf;

	while (len) {
		size_t n = len < (1u << 30) ? len : (1u << 30);

		crc = crc32_iscsi((unsigned char *)p, (int)n, crc);
		p += n;
		len -= n;
	}
	return crc;
}
#else
typedef u32 (*crc_fn)(u32, const void *, size_t);
static crc_fn crc_impl;

__attribute__((constructor))
static void crc_select(void)
{
	__atomic_store_n(&crc_impl, ckpt_crc32c_hw_available() ?
			 ckpt_crc32c_hw : ckpt_crc32c_sw, __ATOMIC_RELAXED);
}

u32 ckpt_crc32c_raw(u32 seed, const void *p, size_t len)
{
	crc_fn f = __atomic_load_n(&crc_impl, __ATOMIC_RELAXED);

	/* Called before the constructors ran (from another constructor). */
	if (!f) {
		crc_select();
		f = __atomic_load_n(&crc_impl, __ATOMIC_RELAXED);
	}
	return f(seed, p, len);
}
#endif
