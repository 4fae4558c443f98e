// SPDX-License-Identifier: GPL-2.0 OR MIT
// vm: cpu-independent
/*
 * Who may use a backing device, and when: a read-only table never changes
 * it; a second ckpt target on the same image (directly or through another dm
 * device) is refused while the first one lives, but a reload of the same
 * mapped device works; every resume checks that the image is still the one
 * the table was loaded for. And what a gradient write's FUA or PREFLUSH
 * means: accepted, nothing more than any gradient write (only COMMIT makes a
 * step durable).
 */
#include "ckpt_kmod.h"
#include <sys/uio.h>
#include "kselftest_harness.h"

#define N_CHUNKS 4
#define SHIFT 11
#define OTHER "ckpt_kt_two"
#define LINEAR "ckpt_kt_lin"

FIXTURE(claim) {
	struct ck_model m;
	uint8_t *image;		/* the layout's bytes after formatting */
};

static void remove_all(void)
{
	ck_remove(OTHER);
	ck_remove(CK_NAME);
	ck_remove(LINEAR);
}

static uint8_t *read_image(const struct ck_model *m)
{
	uint8_t *b = ck_alloc(m->l.dev_bytes);
	int fd = open(m->dev, O_RDONLY | O_DIRECT);

	if (fd < 0 || !b || ck_pread(fd, b, m->l.dev_bytes, 0)) {
		free(b);
		b = NULL;
	}
	if (fd >= 0)
		close(fd);
	return b;
}

/* 0 if the backing device still holds the image as formatted. */
static int unchanged(struct __test_metadata *_metadata, FIXTURE_DATA(claim) *self)
{
	uint8_t *now = read_image(&self->m);
	uint64_t i;
	int ret = -1;

	if (!now) {
		TH_LOG("cannot read %s", self->m.dev);
		return -1;
	}
	for (i = 0; i < self->m.l.dev_bytes && now[i] == self->image[i]; i++)
		;
	if (i == self->m.l.dev_bytes)
		ret = 0;
	else
		TH_LOG("the backing device changed at byte %llu", (unsigned long long)i);
	free(now);
	return ret;
}

FIXTURE_SETUP(claim)
{
	struct ckpt_geometry g = ck_geo(N_CHUNKS, SHIFT, 1, CKPT_DTYPE_BF16);

	remove_all();
	ASSERT_EQ(0, ck_format(&self->m, ck_dev(), &g, 31));
	self->image = read_image(&self->m);
	ASSERT_NE(NULL, self->image);
	ck_kmsg_clear();
}

FIXTURE_TEARDOWN(claim)
{
	remove_all();
	EXPECT_EQ(0, ck_kmsg_bug());
	free(self->image);
	ck_model_free(&self->m);
}

static void group_token(char *out, size_t n, const struct ckpt_hparams *h)
{
	snprintf(out, n, "%08x,%08x,%08x,%08x,%08x,%08x,%08x,%08x,%08x,%08x,%x", h->lr, h->beta1,
		 h->beta2, h->eps, h->weight_decay, h->one_minus_beta1, h->one_minus_beta2,
		 h->step_size, h->bc2_sqrt, h->decay, h->flags);
}

/* The first word of the INFO status line (the state), or "" */
static void dm_state(const char *name, char *out, size_t n)
{
	char line[1024] = "", *p;

	ck_sh(line, sizeof(line), "dmsetup status %s 2>&1", name);
	p = strstr(line, " ckpt ");
	snprintf(out, n, "%s", p ? p + 6 : "");
	p = strchr(out, ' ');
	if (p)
		*p = 0;
}

TEST_F(claim, read_only_table_never_writes)
{
	struct ckpt_hparams hp = ck_hparams(1e-3, 0.9, 0.999, 1e-8, 0.0, 0, 1);
	char table[512], tok[128], out[4096], state[32];

	snprintf(table, sizeof(table), "0 %llu ckpt %s",
		 (unsigned long long)ck_sectors(&self->m), ck_dev());
	ASSERT_EQ(0, ck_sh(out, sizeof(out), "dmsetup create --readonly --noudevsync %s --table '%s' 2>&1",
			   CK_NAME, table)) TH_LOG("%s", out);
	ck_sh(NULL, 0, "dmsetup mknodes %s", CK_NAME);
	group_token(tok, sizeof(tok), &hp);
	EXPECT_NE(0, ck_sh(out, sizeof(out), "dmsetup message %s 0 begin 1 %08x %s 2>&1", CK_NAME,
			   ck_f32(1.0), tok));
	EXPECT_NE(0, ck_sh(out, sizeof(out), "dmsetup message %s 0 commit 1 2>&1", CK_NAME));
	EXPECT_NE(0, ck_sh(out, sizeof(out), "dmsetup message %s 0 abort 2>&1", CK_NAME));
	dm_state(CK_NAME, state, sizeof(state));
	EXPECT_STREQ("idle", state);
	/* stats still answer */
	EXPECT_EQ(0, ck_sh(out, sizeof(out), "dmsetup message %s 0 stats 2>&1", CK_NAME));
	EXPECT_NE(NULL, strstr(out, "state idle"));
	ck_kmsg_clear();
	EXPECT_EQ(0, ck_sh(out, sizeof(out), "dmsetup suspend --noudevsync %s 2>&1", CK_NAME));
	EXPECT_EQ(0, ck_sh(out, sizeof(out), "dmsetup resume --noudevsync %s 2>&1", CK_NAME));
	ck_remove(CK_NAME);
	EXPECT_EQ(0, unchanged(_metadata, self));
}

TEST_F(claim, second_target_on_the_same_image_is_refused)
{
	char table[512], out[4096], state[32], lin[64];
	uint64_t dev_sectors = ck_dev_bytes(ck_dev()) / 512;

	ASSERT_EQ(0, ck_create_ckpt(&self->m, CK_NAME, ck_dev(), NULL));
	/* directly on the same device */
	ck_kmsg_clear();
	EXPECT_NE(0, ck_create_ckpt(&self->m, OTHER, ck_dev(), NULL));
	EXPECT_EQ(1, ck_kmsg_has("in use by another ckpt device"));
	ck_remove(OTHER);
	/* through a linear mapping of it */
	snprintf(table, sizeof(table), "0 %llu linear %s 0", (unsigned long long)dev_sectors,
		 ck_dev());
	ASSERT_EQ(0, ck_create(LINEAR, table));
	snprintf(lin, sizeof(lin), "/dev/mapper/%s", LINEAR);
	ck_kmsg_clear();
	EXPECT_NE(0, ck_create_ckpt(&self->m, OTHER, lin, NULL));
	EXPECT_EQ(1, ck_kmsg_has("in use by another ckpt device"));
	ck_remove(OTHER);
	/* a reload of the live device is not a second user */
	snprintf(table, sizeof(table), "0 %llu ckpt %s 2 queue_depth 2",
		 (unsigned long long)ck_sectors(&self->m), ck_dev());
	EXPECT_EQ(0, ck_sh(out, sizeof(out), "dmsetup reload --noudevsync %s --table '%s' 2>&1",
			   CK_NAME, table)) TH_LOG("%s", out);
	EXPECT_EQ(0, ck_sh(out, sizeof(out), "dmsetup resume --noudevsync %s 2>&1", CK_NAME))
		TH_LOG("%s", out);
	ck_sh(out, sizeof(out), "dmsetup table %s", CK_NAME);
	EXPECT_NE(NULL, strstr(out, "queue_depth 2")) TH_LOG("%s", out);
	dm_state(CK_NAME, state, sizeof(state));
	EXPECT_STREQ("idle", state);
	/* once the first is gone, the image is free again */
	ck_remove(CK_NAME);
	EXPECT_EQ(0, ck_create_ckpt(&self->m, OTHER, lin, NULL));
	ck_remove(OTHER);
}

TEST_F(claim, every_resume_checks_the_image)
{
	struct ckpt_sb other = self->m.sb;
	uint8_t *blk = ck_alloc(CKPT_BLOCK), *orig = ck_alloc(CKPT_BLOCK);
	int k = (int)(self->m.sb.sequence & 1);
	char out[4096], state[32];
	int fd;

	ASSERT_NE(NULL, blk);
	ASSERT_EQ(0, ck_create_ckpt(&self->m, CK_NAME, ck_dev(), NULL));
	fd = open(ck_dev(), O_RDONLY | O_DIRECT);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, ck_pread(fd, orig, CKPT_BLOCK, (uint64_t)k * CKPT_BLOCK));
	close(fd);
	/* reformatted behind the table's back while it was suspended */
	other.uuid[0] ^= 0x5a;
	ASSERT_EQ(0, ckpt_sb_encode(&other, blk));
	ASSERT_EQ(0, ck_sh(out, sizeof(out), "dmsetup suspend --noudevsync %s 2>&1", CK_NAME));
	ASSERT_EQ(0, ck_write_sb_block(ck_dev(), blk, k));
	ck_kmsg_clear();
	EXPECT_NE(0, ck_sh(out, sizeof(out), "dmsetup resume --noudevsync %s 2>&1", CK_NAME));
	EXPECT_EQ(1, ck_kmsg_has("reformatted"));
	/* another writer committed a step behind its back */
	other = self->m.sb;
	other.sequence++;
	other.committed_step = 7;
	memset(blk, 0, CKPT_BLOCK);
	ASSERT_EQ(0, ckpt_sb_encode(&other, blk));
	ASSERT_EQ(0, ck_write_sb_block(ck_dev(), orig, k));
	ASSERT_EQ(0, ck_write_sb_block(ck_dev(), blk, k ^ 1));
	ck_kmsg_clear();
	EXPECT_NE(0, ck_sh(out, sizeof(out), "dmsetup resume --noudevsync %s 2>&1", CK_NAME));
	EXPECT_EQ(1, ck_kmsg_has("changed"));
	/* the image as it was: resumes */
	memset(blk, 0, CKPT_BLOCK);
	ASSERT_EQ(0, ck_write_sb_block(ck_dev(), blk, k ^ 1));
	EXPECT_EQ(0, ck_sh(out, sizeof(out), "dmsetup resume --noudevsync %s 2>&1", CK_NAME))
		TH_LOG("%s", out);
	dm_state(CK_NAME, state, sizeof(state));
	EXPECT_STREQ("idle", state);
	free(blk);
	free(orig);
}

/*
 * Gradient writes with FUA (O_DSYNC) and a flush (fdatasync) in the middle
 * of a step are accepted and change nothing about the step: it commits
 * exactly as the reference.
 */
TEST_F(claim, fua_and_flush_on_gradients)
{
	struct ckpt_hparams hp = ck_hparams(1e-3, 0.9, 0.999, 1e-8, 0.01, 0, 1);
	struct ck_model *m = &self->m;
	const uint64_t cb = m->l.plo_chunk_bytes;
	uint16_t *grad = calloc(m->l.n_params, 2);
	uint8_t *b = ck_alloc(m->l.n_params * 2);
	struct ckpt_status st;
	struct iovec iov;
	struct ck_rng r = { 3 };
	char why[256];
	uint64_t i;
	int fd;

	ASSERT_NE(NULL, grad);
	for (i = 0; i < m->l.n_params; i++) {
		float gv = (ck_uniform(&r) - 0.5f) * 0.1f;
		uint32_t bits;

		memcpy(&bits, &gv, 4);
		grad[i] = ckpt_f32_to_bf16(bits);
	}
	memcpy(b, grad, m->l.n_params * 2);
	ASSERT_EQ(0, ck_create_ckpt(m, CK_NAME, ck_dev(), NULL));
	fd = ck_open_dm(CK_NAME);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, ck_begin(fd, 1, ck_f32(1.0), &hp, 1));
	ck_model_step(m, 1, &hp, ck_f32(1.0), grad, NULL);
	/* chunk 0 whole with FUA, chunk 1 in two FUA halves, then a flush */
	iov.iov_base = b;
	iov.iov_len = cb;
	EXPECT_EQ((ssize_t)cb, pwritev2(fd, &iov, 1, m->l.grad_off, RWF_DSYNC));
	iov.iov_base = b + cb;
	iov.iov_len = cb / 2;
	EXPECT_EQ((ssize_t)cb / 2, pwritev2(fd, &iov, 1, m->l.grad_off + cb, RWF_DSYNC));
	EXPECT_EQ(0, fdatasync(fd));
	iov.iov_base = b + cb + cb / 2;
	iov.iov_len = cb / 2;
	EXPECT_EQ((ssize_t)cb / 2,
		  pwritev2(fd, &iov, 1, m->l.grad_off + cb + cb / 2, RWF_DSYNC));
	/* a FUA write twice over a chunk is refused like any other */
	iov.iov_base = b;
	iov.iov_len = cb;
	EXPECT_EQ(-1, pwritev2(fd, &iov, 1, m->l.grad_off, RWF_DSYNC));
	ASSERT_EQ(0, ck_status(fd, &st));
	EXPECT_EQ(CKPT_E_TWICE, st.last_error);
	EXPECT_EQ(2, st.chunks_done);
	EXPECT_EQ(0, fsync(fd));
	ASSERT_EQ(0, ck_grad(fd, m, grad, 2 * cb, m->l.n_params * 2 - 2 * cb));
	ASSERT_EQ(0, ck_commit(fd, 1, NULL, 0));
	ck_model_commit(m, 1, NULL, 0);
	EXPECT_EQ(0, ck_model_verify(m, why, sizeof(why))) TH_LOG("%s", why);
	close(fd);
	free(grad);
	free(b);
}

TEST_HARNESS_MAIN
