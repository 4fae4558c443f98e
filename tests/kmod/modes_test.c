// SPDX-License-Identifier: GPL-2.0 OR MIT
// vm: cpu-independent
/*
 * dm-ckpt's failed mode as userspace sees it: entering it raises a table
 * event (dmsetup info's event number, what dmsetup wait and dmeventd wait
 * for), the first error's real errno is kept and reported as first_io_error,
 * `dmsetup measure` (STATUSTYPE_IMA) names the table and its state, and
 * messages a user can repeat at will do not flood the kernel log.
 */
#include "ckpt_kmod.h"
#include <linux/dm-ioctl.h>
#include "kselftest_harness.h"

#define N_CHUNKS 4
#define SHIFT 11		/* 2048 params, 4 KiB of gradients per chunk */
#define BK "ckpt_mt_bk"

FIXTURE(modes) {
	struct ck_model m;
	int fd;
	uint16_t *grad;
	struct ckpt_hparams hp;
	uint64_t sectors;	/* of the backing device */
};

/* The target over a dm-linear view of the device, so the view can fail. */
FIXTURE_SETUP(modes)
{
	struct ckpt_geometry g = ck_geo(N_CHUNKS, SHIFT, 1, CKPT_DTYPE_BF16);
	char table[256];

	ck_remove(CK_NAME);
	ck_remove(BK);
	ASSERT_EQ(0, ck_format(&self->m, ck_dev(), &g, 7));
	self->sectors = ck_dev_bytes(ck_dev()) / 512;
	snprintf(table, sizeof(table), "0 %llu linear %s 0",
		 (unsigned long long)self->sectors, ck_dev());
	ASSERT_EQ(0, ck_create(BK, table));
	ASSERT_EQ(0, ck_create_ckpt(&self->m, CK_NAME, "/dev/mapper/" BK, "2 queue_depth 4"));
	self->fd = ck_open_dm(CK_NAME);
	ASSERT_LE(0, self->fd);
	/* small gradients: a step that runs must not overflow */
	self->grad = calloc(self->m.l.n_params, 2);
	ASSERT_NE(NULL, self->grad);
	self->hp = ck_hparams(1e-3, 0.9, 0.999, 1e-8, 0.01, 0, 1);
	ck_kmsg_clear();
}

FIXTURE_TEARDOWN(modes)
{
	if (self->fd >= 0)
		close(self->fd);
	ck_remove(CK_NAME);
	ck_remove(BK);
	EXPECT_EQ(0, ck_kmsg_bug());
	free(self->grad);
	ck_model_free(&self->m);
}

/* The event number of a dm device (dmsetup info), or -1. */
static long events(const char *name)
{
	char out[2048], *p;

	if (ck_sh(out, sizeof(out), "dmsetup info %s 2>&1", name))
		return -1;
	p = strstr(out, "Event number:");
	return p ? strtol(p + strlen("Event number:"), NULL, 10) : -1;
}

/* Replace the backing view's table: "error" kills it, "linear" restores it. */
static int swap_backing(FIXTURE_DATA(modes) *self, const char *target)
{
	char table[256];

	if (!strcmp(target, "error"))
		snprintf(table, sizeof(table), "0 %llu error", (unsigned long long)self->sectors);
	else
		snprintf(table, sizeof(table), "0 %llu linear %s 0",
			 (unsigned long long)self->sectors, ck_dev());
	return ck_reload(BK, table);
}

/* Lines of the kernel log since the last clear that contain s. */
static int kmsg_count(const char *s)
{
	char *log = ck_kmsg(), *p;
	int n = 0;

	for (p = log; p && (p = strstr(p, s)); p += strlen(s))
		n++;
	free(log);
	return n;
}

/*
 * The backing device dies during a step: the write fails, the target enters
 * failed mode once, with one table event, and keeps the errno (dm-io reports
 * EIO for a dead device) while later commands are refused without another
 * event.
 */
TEST_F(modes, backing_error_raises_an_event_and_keeps_the_errno)
{
	struct ckpt_status st;
	char out[1024];
	long e0, e1;

	ASSERT_EQ(0, ck_begin(self->fd, 1, ck_f32(1.0), &self->hp, 1));
	e0 = events(CK_NAME);
	ASSERT_LE(0, e0);
	ASSERT_EQ(0, swap_backing(self, "error"));
	EXPECT_EQ(-EIO, ck_grad(self->fd, &self->m, self->grad, 0, self->m.l.plo_chunk_bytes));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_FAILED, st.state);
	EXPECT_EQ(EIO, st.first_io_error);
	e1 = events(CK_NAME);
	EXPECT_LT(e0, e1);

	EXPECT_EQ(-EIO, ck_commit(self->fd, 1, NULL, 0));
	EXPECT_NE(0, ck_sh(out, sizeof(out), "dmsetup message %s 0 abort 2>&1", CK_NAME));
	EXPECT_NE(NULL, strstr(out, "Input/output error"));
	EXPECT_EQ(e1, events(CK_NAME));
	ASSERT_EQ(0, ck_sh(out, sizeof(out), "dmsetup status %s", CK_NAME));
	EXPECT_NE(NULL, strstr(out, " ckpt failed 0 0 0/4 "));
	EXPECT_EQ(1, ck_kmsg_has("failed mode"));
	ASSERT_EQ(0, swap_backing(self, "linear"));
}

/*
 * A damaged state record is not an I/O error of the device: the step fails
 * with EILSEQ, as dm-integrity reports a checksum mismatch, and that errno,
 * not a constant EIO, is the first_io_error the status reports.
 */
TEST_F(modes, damaged_record_reports_eilseq)
{
	const uint32_t slot = self->m.sb.committed_slot;
	struct ckpt_status st;
	char out[1024], want[64];
	long e0;

	/* a bit of p[0] of chunk 1 in the committed slot */
	ASSERT_EQ(0, ck_flip_record_data(&self->m, slot, 1, 1, 0x10));

	e0 = events(CK_NAME);
	ASSERT_EQ(0, ck_begin(self->fd, 1, ck_f32(1.0), &self->hp, 1));
	EXPECT_EQ(-EIO, ck_grad(self->fd, &self->m, self->grad, self->m.l.plo_chunk_bytes,
				self->m.l.plo_chunk_bytes));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_FAILED, st.state);
	EXPECT_EQ(EILSEQ, st.first_io_error);
	EXPECT_LT(e0, events(CK_NAME));
	EXPECT_EQ(1, ck_kmsg_has("chunk 1 slot 0: data checksum mismatch"));
	ASSERT_EQ(0, ck_sh(out, sizeof(out), "dmsetup status %s", CK_NAME));
	snprintf(want, sizeof(want), " %d 0 0 0 0 ", EILSEQ);
	EXPECT_NE(NULL, strstr(out, want));
}

/* dmsetup measure (STATUSTYPE_IMA): the table's parameters and the state. */
TEST_F(modes, measure_names_the_table_and_state)
{
	char out[2048], want[128];

	ASSERT_EQ(0, ck_sh(out, sizeof(out), "dmsetup measure %s 2>&1", CK_NAME));
	TH_LOG("%s", out);
	EXPECT_NE(NULL, strstr(out, "target_name=ckpt,target_version="));
	EXPECT_NE(NULL, strstr(out, ",queue_depth=4,staging_kb=65536,"));
	EXPECT_NE(NULL, strstr(out, ",state=idle,first_io_error=0;"));
	EXPECT_NE(NULL, strstr(out, ",uuid="));
	EXPECT_NE(NULL, strstr(out, ",dev_name="));

	ASSERT_EQ(0, swap_backing(self, "error"));
	ASSERT_EQ(0, ck_begin(self->fd, 1, ck_f32(1.0), &self->hp, 1));
	EXPECT_EQ(-EIO, ck_grad(self->fd, &self->m, self->grad, 0, self->m.l.plo_chunk_bytes));
	ASSERT_EQ(0, ck_sh(out, sizeof(out), "dmsetup measure %s 2>&1", CK_NAME));
	snprintf(want, sizeof(want), ",state=failed,first_io_error=%d;", EIO);
	EXPECT_NE(NULL, strstr(out, want));
	ASSERT_EQ(0, swap_backing(self, "linear"));
}

/*
 * Refused messages cost the kernel log a few lines, however many a user
 * sends (printk's rate limit: 10 per call site and 5 s); the errno says what
 * kind of refusal it was.
 */
TEST_F(modes, refused_messages_are_rate_limited)
{
	int i;

	for (i = 0; i < 300; i++) {
		ASSERT_EQ(-EINVAL, ck_dm_message(CK_NAME, "bogus"));
		ASSERT_EQ(-EINVAL, ck_dm_message(CK_NAME, "begin x"));
		ASSERT_EQ(-EINVAL, ck_dm_message(CK_NAME, "commit 7"));
	}
	TH_LOG("unknown %d, usage %d, refused %d", kmsg_count("unknown message"),
	       kmsg_count("usage: begin"), kmsg_count("message commit refused"));
	EXPECT_LE(1, kmsg_count("unknown message"));
	EXPECT_GE(30, kmsg_count("unknown message"));
	EXPECT_GE(30, kmsg_count("usage: begin"));
	EXPECT_GE(30, kmsg_count("message commit refused"));
}

TEST_HARNESS_MAIN
