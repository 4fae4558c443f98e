// SPDX-License-Identifier: GPL-2.0 OR MIT
// vm: cpu-independent
/*
 * dm-ckpt constructor memory limits: staging_kb and queue_depth across their
 * whole documented ranges, with the largest chunks (4 Mi params, 8 MiB of
 * gradients, 48 MiB of state) and with 2^18 small chunks, must either work or
 * be refused with an error naming the option; never a WARNING (the guest
 * panics on one), an allocation failure splat or the OOM killer.
 *
 * The images are formatted sparsely (superblock and group table only) and
 * need a backing device of about 40 GB: tests.sh gives the kmod run a 64G
 * sparse NVMe image.
 */
#include "ckpt_kmod.h"
#include "kselftest_harness.h"

#define GIB (1ull << 30)

static unsigned long long oom_kills(void)
{
	char out[64] = "";

	ck_sh(out, sizeof(out), "awk '$1 == \"oom_kill\" { print $2 }' /proc/vmstat");
	return strtoull(out, NULL, 10);
}

/*
 * Create a ckpt table over a sparse image of geometry g with opts: 0 if it was
 * accepted (and removed again), 1 if refused with want_error in the kernel
 * log, -1 otherwise (logged).
 */
static int try_create(struct __test_metadata *_metadata, const struct ckpt_geometry *g,
		      const char *opts, const char *want_error)
{
	unsigned long long ooms = oom_kills();
	struct ckpt_sb sb;
	char table[512];
	int ret;

	ret = ck_format_sparse(&sb, ck_dev(), g, 5);
	if (ret == -ENOSPC) {
		TH_LOG("%s has %llu bytes, the layout needs %llu: run the VM with --image-size 64G",
		       ck_dev(), (unsigned long long)ck_dev_bytes(ck_dev()),
		       (unsigned long long)sb.regions.dev_bytes);
		return -1;
	}
	if (ret) {
		TH_LOG("format: %s", strerror(-ret));
		return -1;
	}
	snprintf(table, sizeof(table), "0 %llu ckpt %s %s",
		 (unsigned long long)(sb.regions.virt_bytes / 512), ck_dev(), opts);
	ck_kmsg_clear();
	ret = ck_create(CK_NAME, table);
	if (!ret)
		ck_remove(CK_NAME);
	if (ck_kmsg_bug() || ck_kmsg_has("allocation failure") || ck_kmsg_has("vmalloc error")) {
		char *log = ck_kmsg();

		TH_LOG("'%s': kernel report:\n%s", table, log ? log : "");
		free(log);
		return -1;
	}
	if (oom_kills() != ooms) {
		TH_LOG("'%s': the OOM killer ran", table);
		return -1;
	}
	if (!ret)
		return 0;
	if (want_error && ck_kmsg_has(want_error))
		return 1;
	{
		char *log = ck_kmsg();

		TH_LOG("'%s' refused without '%s':\n%s", table, want_error ? want_error : "?",
		       log ? log : "");
		free(log);
	}
	return -1;
}

FIXTURE(limits) {
	int unused;
};

FIXTURE_SETUP(limits)
{
	ck_remove(CK_NAME);
}

FIXTURE_TEARDOWN(limits)
{
	ck_remove(CK_NAME);
}

/* 300 chunks of 8 MiB: staging_kb's maximum asks for 300 stages, 2.3 GiB. */
TEST_F_TIMEOUT(limits, max_staging_with_8mib_chunks, 300)
{
	struct ckpt_geometry g = ck_geo(300, 22, 1, CKPT_DTYPE_BF16);

	EXPECT_LE(0, try_create(_metadata, &g, "2 staging_kb 4194304", "staging_kb"));
	/* what fits in the guest's memory is accepted */
	EXPECT_EQ(0, try_create(_metadata, &g, "2 staging_kb 65536", "staging_kb"));
	EXPECT_EQ(0, try_create(_metadata, &g, "", NULL));
}

/* 2^18 chunks of 4 KiB: 2^18 stages (their array alone is 6 MiB). */
TEST_F_TIMEOUT(limits, max_staging_with_2_18_chunks, 300)
{
	struct ckpt_geometry g = ck_geo(1u << 18, 11, 1, CKPT_DTYPE_FP16);

	EXPECT_LE(0, try_create(_metadata, &g, "2 staging_kb 4194304", "staging_kb"));
	EXPECT_LE(0, try_create(_metadata, &g, "2 staging_kb 1048576", "staging_kb"));
	EXPECT_EQ(0, try_create(_metadata, &g, "2 staging_kb 262144", "staging_kb"));
	EXPECT_EQ(0, try_create(_metadata, &g, "", NULL));
}

/* queue_depth 128 with 48 MiB records: 8 GiB of chunk buffers. */
TEST_F_TIMEOUT(limits, max_queue_depth_with_8mib_chunks, 300)
{
	struct ckpt_geometry g = ck_geo(4, 22, 1, CKPT_DTYPE_BF16);

	EXPECT_LE(0, try_create(_metadata, &g, "2 queue_depth 128", "queue_depth"));
	EXPECT_LE(0, try_create(_metadata, &g, "4 queue_depth 128 staging_kb 4194304",
				"queue_depth"));
	EXPECT_EQ(0, try_create(_metadata, &g, "2 queue_depth 2", "queue_depth"));
}

TEST_HARNESS_MAIN
