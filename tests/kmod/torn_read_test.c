// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * A PARAM read is remapped by map() to the p_lo slot that holds the chunk's
 * latest values. While that read is in flight the writer may commit, begin
 * the next step and write gradients, whose chunk updates rewrite p_lo in the
 * other slot; the step after that rewrites the slot the read is still
 * reading. Every read must return the parameters of exactly one step: the
 * committed one when the read started (c0), or the open one (c0 + 1) for
 * a chunk already updated; never a later step and never a mix.
 *
 * The backing device is a dm stack over the NVMe that delays reads of the
 * p_lo slots only (dm-delay, DELAY_MS), so that a read stays in flight across
 * several steps while the updates, which read their records undelayed, go on.
 */
#include "ckpt_kmod.h"
#include <pthread.h>
#include <stdatomic.h>
#include "kselftest_harness.h"

#define N_CHUNKS 4
#define SHIFT 12		/* 4096 params, 8 KiB of p_lo per chunk */
#define STEPS 8
#define READERS 3
#define DELAY_MS 600
#define PAUSE_MS 150		/* between a commit and the next begin */
#define STACK "ckpt_kt_delay"

struct torn {
	struct ck_model m;
	uint16_t *hist[STEPS + 1];	/* p_lo of the whole window after step t */
	atomic_int stop;
	atomic_int bad;
	atomic_long reads;
	char why[256];
	pthread_mutex_t why_lock;
};

static void torn_note(struct torn *t, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&t->why_lock);
	if (!t->why[0]) {
		va_start(ap, fmt);
		vsnprintf(t->why, sizeof(t->why), fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&t->why_lock);
	atomic_store(&t->bad, 1);
}

static void *reader(void *arg)
{
	struct torn *t = arg;
	const struct ck_model *m = &t->m;
	const uint64_t cb = m->l.plo_chunk_bytes;
	int fd = ck_open_dm(CK_NAME);
	uint16_t *rd = ck_alloc(cb);
	struct ck_rng r = { (uint64_t)(uintptr_t)rd };
	struct ckpt_status st;

	if (fd < 0 || !rd) {
		torn_note(t, "reader: cannot open the device");
		goto out;
	}
	while (!atomic_load(&t->stop)) {
		uint32_t c = (uint32_t)(ck_next(&r) % N_CHUNKS);
		uint64_t c0, k;
		int ret;

		ret = ck_status(fd, &st);
		if (!ret)
			ret = ck_pread(fd, rd, cb, m->l.param_off + c * cb);
		if (ret) {
			torn_note(t, "reader: %s", strerror(-ret));
			break;
		}
		atomic_fetch_add(&t->reads, 1);
		c0 = st.committed_step;
		for (k = c0; k <= c0 + 1 && k <= STEPS; k++)
			if (!memcmp(rd, t->hist[k] + (size_t)c * m->cp, cb))
				break;
		if (k <= c0 + 1 && k <= STEPS)
			continue;
		for (k = 0; k <= STEPS; k++)
			if (!memcmp(rd, t->hist[k] + (size_t)c * m->cp, cb))
				break;
		if (k <= STEPS)
			torn_note(t, "read of chunk %u that started at committed step %llu returned step %llu",
				  c, (unsigned long long)c0, (unsigned long long)k);
		else
			torn_note(t, "read of chunk %u that started at committed step %llu returned a mix of steps",
				  c, (unsigned long long)c0);
	}
out:
	if (fd >= 0)
		close(fd);
	free(rd);
	return NULL;
}

FIXTURE(torn) {
	struct torn t;
};

FIXTURE_SETUP(torn)
{
	struct ckpt_geometry g = ck_geo(N_CHUNKS, SHIFT, 1, CKPT_DTYPE_BF16);

	ck_remove(CK_NAME);
	ck_remove(STACK);
	memset(&self->t, 0, sizeof(self->t));
	pthread_mutex_init(&self->t.why_lock, NULL);
	ASSERT_EQ(0, ck_format(&self->t.m, ck_dev(), &g, 23));
	ck_kmsg_clear();
}

FIXTURE_TEARDOWN(torn)
{
	int i;

	ck_remove(CK_NAME);
	ck_remove(STACK);
	EXPECT_EQ(0, ck_kmsg_bug());
	for (i = 0; i <= STEPS; i++)
		free(self->t.hist[i]);
	ck_model_free(&self->t.m);
}

TEST_F_TIMEOUT(torn, param_reads_return_one_step, 300)
{
	struct torn *t = &self->t;
	struct ck_model *m = &t->m;
	const uint64_t plo_lo = m->l.plo_off[0] / 512, plo_hi = m->l.rec_off[0] / 512;
	const uint64_t dev_sectors = m->l.dev_bytes / 512;
	const size_t window = (size_t)m->l.n_params * 2;
	uint16_t *grad = calloc(m->l.n_params, 2);
	struct ck_rng r = { 99 };
	pthread_t th[READERS];
	char table[1024], bk[64], why[256];
	uint64_t step, i;
	int fd, n;

	ASSERT_NE(NULL, grad);
	ASSERT_LT(plo_lo, plo_hi);
	/* reads of the p_lo slots delayed, everything else straight through */
	snprintf(table, sizeof(table),
		 "0 %llu linear %s 0\n%llu %llu delay %s %llu %d %s %llu 0\n%llu %llu linear %s %llu",
		 (unsigned long long)plo_lo, ck_dev(),
		 (unsigned long long)plo_lo, (unsigned long long)(plo_hi - plo_lo), ck_dev(),
		 (unsigned long long)plo_lo, DELAY_MS, ck_dev(), (unsigned long long)plo_lo,
		 (unsigned long long)plo_hi, (unsigned long long)(dev_sectors - plo_hi), ck_dev(),
		 (unsigned long long)plo_hi);
	ASSERT_EQ(0, ck_create(STACK, table)) TH_LOG("cannot create '%s'", table);
	snprintf(bk, sizeof(bk), "/dev/mapper/%s", STACK);
	ASSERT_EQ(0, ck_create_ckpt(m, CK_NAME, bk, NULL));
	fd = ck_open_dm(CK_NAME);
	ASSERT_LE(0, fd);

	/* allocated before the readers start: they compare against all of them */
	for (n = 0; n <= STEPS; n++) {
		t->hist[n] = calloc(1, window);
		ASSERT_NE(NULL, t->hist[n]);
	}
	memcpy(t->hist[0], m->plo[m->sb.committed_slot], window);
	for (n = 0; n < READERS; n++)
		ASSERT_EQ(0, pthread_create(&th[n], NULL, reader, t));

	for (step = 1; step <= STEPS && !atomic_load(&t->bad); step++) {
		struct ckpt_hparams hp = ck_hparams(1e-2, 0.9, 0.999, 1e-8, 0.01, 0, step);
		uint32_t gs = ck_f32(1.0);

		for (i = 0; i < m->l.n_params; i++) {
			float gv = (ck_uniform(&r) - 0.5f) * 0.5f;
			uint32_t b;

			memcpy(&b, &gv, 4);
			grad[i] = ckpt_f32_to_bf16(b);
		}
		ASSERT_EQ(0, ck_begin(fd, step, gs, &hp, 1));
		ck_model_step(m, step, &hp, gs, grad, NULL);
		memcpy(t->hist[step], m->plo[m->sb.committed_slot ^ 1], window);
		ASSERT_EQ(0, ck_grad(fd, m, grad, 0, window));
		ASSERT_EQ(0, ck_commit(fd, step, NULL, 0));
		ck_model_commit(m, step, NULL, 0);
		usleep(PAUSE_MS * 1000);
	}
	atomic_store(&t->stop, 1);
	for (n = 0; n < READERS; n++)
		pthread_join(th[n], NULL);
	close(fd);
	free(grad);
	TH_LOG("%ld PARAM reads over %llu steps", atomic_load(&t->reads),
	       (unsigned long long)(step - 1));
	EXPECT_EQ(0, atomic_load(&t->bad)) TH_LOG("%s", t->why);
	EXPECT_LT(STEPS, atomic_load(&t->reads));
	EXPECT_EQ(0, ck_model_verify(m, why, sizeof(why))) TH_LOG("%s", why);
}

TEST_HARNESS_MAIN
