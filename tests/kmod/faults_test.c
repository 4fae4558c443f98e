// SPDX-License-Identifier: GPL-2.0 OR MIT
// vm: cpu-independent
/*
 * Faults under the target: a device-mapper layer between dm-ckpt and the
 * NVMe namespace is switched, under the live target, to dm-flakey
 * (error_writes, drop_writes), dm-error, a table with error segments over a
 * record or the superblocks (bad blocks: Debian's kernels have no dm-dust),
 * a thin pool that runs out of space; the target's table is swapped or
 * force-removed with a step open; a dm-linear shorter than the superblock
 * says is offered to the constructor.
 *
 * For each fault: the target reports it (state failed, first_io_error, a
 * table event that DM_DEV_WAIT sees), refuses new steps and never reports a
 * commit that did not reach the device. With the fault gone and the target
 * created again, the last committed step is on the device bit for bit
 * (superblock with the trainer blob, records with params and both moments,
 * p_lo), the PARAM window shows it, ckptctl verify passes, and training goes
 * on.
 *
 * A rollback whose I/O fails before its superblock write changes nothing
 * the target goes on from; once that write is issued it fails the target
 * as a failed COMMIT does, and the device commits the step it names.
 *
 * drop_writes loses writes without an error. A lost superblock write is
 * caught when the commit reads it back (COMMIT fails). Lost record writes
 * cannot be seen when they happen (COMMIT succeeds), but the next step
 * reads the records it builds on and refuses the stale ones (step and
 * sequence in the record), and ckptctl verify and restore --rollback
 * return the device to the previous step.
 */
#include "ckpt_kmod.h"
#include "kselftest_harness.h"

#define N_CHUNKS 8
#define SHIFT 11		/* 2048 params, 4 KiB of gradients per chunk */
#define BK "ckpt_ft_bk"
#define SHORT "ckpt_ft_short"
#define SB_LOW "ckpt_ft_sblow"	/* under the superblocks' dm-delay */
#define SB_ERR "ckpt_ft_sberr"
#define T_META "ckpt_ft_meta"
#define T_DATA "ckpt_ft_data"
#define T_POOL "ckpt_ft_pool"
#define T_VOL "ckpt_ft_thin"
#define WAIT_S 20
#define TIMEOUT_S 180	/* per test: TCG on a busy host */

FIXTURE(faults) {
	struct ck_model m;
	int fd;
	uint16_t *grad;
	struct ckpt_hparams hp;
	struct ck_rng rng;
	uint64_t sectors;	/* of the NVMe namespace */
	char backing[64];	/* what the target's table names */
};

static void teardown_thin(void)
{
	ck_remove(T_VOL);
	ck_remove(T_POOL);
	ck_remove(T_META);
	ck_remove(T_DATA);
}

/*
 * ck_format leaves the tensor manifest empty, which ckptctl verify reports
 * as damage: write one tensor over the whole device (group 0) and name it
 * in the superblock (copy 1, sequence 1).
 */
static int add_manifest(struct ck_model *m)
{
	const unsigned long long n = m->l.n_params;
	uint8_t *blk = ck_alloc(CKPT_BLOCK);
	int len, r;

	if (!blk)
		return -ENOMEM;
	len = snprintf((char *)blk, CKPT_BLOCK,
		       "{\"format\":\"dm-ckpt-manifest\",\"version\":1,\"dtype\":\"%s\",\"chunk_params\":%u,\"tensors\":[{\"name\":\"w\",\"shape\":[%llu],\"group\":0,\"offset\":0,\"numel\":%llu}]}",
		       ckpt_dtype_name(m->sb.geo.dtype), m->cp, n, n);
	m->sb.manifest_len = (uint32_t)len;
	m->sb.manifest_crc = ckpt_crc32c(blk, (size_t)len);
	r = ck_write_dev(m->dev, blk, CKPT_BLOCK, m->l.manifest_off);
	memset(blk, 0, CKPT_BLOCK);
	if (!r)
		r = ckpt_sb_encode(&m->sb, blk) ? -EINVAL : ck_write_sb_block(m->dev, blk, 1);
	free(blk);
	return r;
}

FIXTURE_SETUP(faults)
{
	struct ckpt_geometry g = ck_geo(N_CHUNKS, SHIFT, 1, CKPT_DTYPE_BF16);
	char table[256];

	/* loudly: a missing fault target is a failed test, not a skip */
	ASSERT_EQ(1, ck_dm_has_target("flakey")) TH_LOG("dm-flakey missing in the guest");
	ASSERT_EQ(1, ck_dm_has_target("error"));
	ck_remove(CK_NAME);
	ck_remove(BK);
	ck_remove(SHORT);
	teardown_thin();
	self->rng.s = 11;
	ASSERT_EQ(0, ck_format(&self->m, ck_dev(), &g, 7));
	ASSERT_EQ(0, add_manifest(&self->m));
	self->sectors = ck_dev_bytes(ck_dev()) / 512;
	snprintf(table, sizeof(table), "0 %llu linear %s 0",
		 (unsigned long long)self->sectors, ck_dev());
	ASSERT_EQ(0, ck_create(BK, table));
	snprintf(self->backing, sizeof(self->backing), "/dev/mapper/%s", BK);
	ASSERT_EQ(0, ck_create_ckpt(&self->m, CK_NAME, self->backing, NULL));
	self->fd = ck_open_dm(CK_NAME);
	ASSERT_LE(0, self->fd);
	self->grad = calloc(self->m.l.n_params, 2);
	ASSERT_NE(NULL, self->grad);
	ck_kmsg_clear();
}

FIXTURE_TEARDOWN(faults)
{
	if (self->fd >= 0)
		close(self->fd);
	ck_remove(CK_NAME);
	ck_remove(BK);
	ck_remove(SB_LOW);
	ck_remove(SB_ERR);
	ck_remove(SHORT);
	teardown_thin();
	EXPECT_EQ(0, ck_kmsg_bug());
	free(self->grad);
	ck_model_free(&self->m);
}

/* ---------------------------------------------------------------- steps */

static void make_grads(FIXTURE_DATA(faults) *self)
{
	ck_bf16_grads(&self->rng, self->grad, self->m.l.n_params);
}

static int begin(FIXTURE_DATA(faults) *self, uint64_t t)
{
	self->hp = ck_hparams(1e-3, 0.9, 0.999, 1e-8, 0.01, 0, t);
	return ck_begin(self->fd, t, ck_f32(1.0), &self->hp, 1);
}

/* Gradients of chunks [lo, hi), one write per chunk: 0 or the first -errno. */
static int grads(FIXTURE_DATA(faults) *self, uint32_t lo, uint32_t hi)
{
	const uint64_t cb = self->m.l.plo_chunk_bytes;
	uint32_t c;
	int r;

	for (c = lo; c < hi; c++) {
		r = ck_grad(self->fd, &self->m, self->grad, c * cb, cb);
		if (r)
			return r;
	}
	return 0;
}

/* A whole step t through the virtual device; the model follows. */
static int full_step(struct __test_metadata *_metadata, FIXTURE_DATA(faults) *self,
		     uint64_t t, const char *blob)
{
	uint32_t n = blob ? (uint32_t)strlen(blob) : 0;
	char why[256];
	int r;

	make_grads(self);
	r = begin(self, t);
	if (!r)
		r = grads(self, 0, N_CHUNKS);
	if (!r)
		r = ck_commit(self->fd, t, blob, n);
	if (r) {
		TH_LOG("step %llu: %s", (unsigned long long)t, strerror(-r));
		return r;
	}
	ck_model_step(&self->m, t, &self->hp, ck_f32(1.0), self->grad, NULL);
	ck_model_commit(&self->m, t, blob, n);
	if (ck_model_verify(&self->m, why, sizeof(why))) {
		TH_LOG("after step %llu: %s", (unsigned long long)t, why);
		return -1;
	}
	return 0;
}

/*
 * A step failed part way: what the slot it wrote holds is unknown, and only
 * the committed slot is compared from now on (a later step rewrites it).
 */
static void forget_open_slot(struct ck_model *m)
{
	memset(m->valid[m->sb.committed_slot ^ 1], 0, sizeof(m->valid[0]));
}

/* ---------------------------------------------------------------- checks */

static int swap(FIXTURE_DATA(faults) *self, const char *name, const char *table)
{
	char out[1024];

	if (ck_dm_swap(name, table, out, sizeof(out))) {
		printf("# swap %s to '%s': %s\n", name, table, out);
		return -1;
	}
	return 0;
}

static void linear_table(FIXTURE_DATA(faults) *self, char *t, size_t n)
{
	snprintf(t, n, "0 %llu linear %s 0", (unsigned long long)self->sectors, ck_dev());
}

/*
 * The target after a fault in step t (it last committed `committed`, the
 * model's step): it raised a table event after e0, is failed with first io
 * error want (0: any), says so in its status line, refuses COMMIT of t,
 * a BEGIN of any step and the begin message.
 */
static void expect_failed(struct __test_metadata *_metadata, FIXTURE_DATA(faults) *self,
			  long e0, int want, uint64_t t, uint64_t committed)
{
	struct ckpt_status st;
	char out[1024], line[64];

	ASSERT_LE(0, e0);
	EXPECT_EQ(0, ck_dm_wait(CK_NAME, (uint32_t)e0, WAIT_S));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_FAILED, st.state);
	EXPECT_EQ(committed, st.committed_step);
	if (want) {
		EXPECT_EQ(want, st.first_io_error);
	} else {
		EXPECT_NE(0, st.first_io_error);
	}
	TH_LOG("first_io_error %u", st.first_io_error);
	ASSERT_EQ(0, ck_sh(out, sizeof(out), "dmsetup status %s", CK_NAME));
	snprintf(line, sizeof(line), " ckpt failed %llu ", (unsigned long long)committed);
	EXPECT_NE(NULL, strstr(out, line)) TH_LOG("status: %s", out);
	EXPECT_EQ(1, ck_kmsg_has("failed mode"));

	EXPECT_EQ(-EIO, ck_commit(self->fd, t, NULL, 0));
	EXPECT_EQ(-EIO, begin(self, t));
	EXPECT_EQ(-EIO, begin(self, t + 1));
	EXPECT_NE(0, ck_sh(out, sizeof(out), "dmsetup message %s 0 commit %llu 2>&1", CK_NAME,
			   (unsigned long long)t));
	EXPECT_NE(NULL, strstr(out, "Input/output error")) TH_LOG("commit message: %s", out);
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(committed, st.committed_step);
	EXPECT_EQ(CKPT_STATE_FAILED, st.state);
}

/*
 * The committed state on the device, with no target on it: the model's
 * superblock (step, sequence, trainer blob) and committed records (params,
 * both moments) and p_lo byte for byte, and ckptctl verify says ok.
 */
static void expect_committed_on_disk(struct __test_metadata *_metadata,
				     FIXTURE_DATA(faults) *self)
{
	char why[256], out[4096];

	EXPECT_EQ(0, ck_model_verify(&self->m, why, sizeof(why))) TH_LOG("%s", why);
	EXPECT_EQ(0, ck_sh(out, sizeof(out), "ckptctl verify %s 2>&1", self->m.dev))
		TH_LOG("ckptctl verify: %s", out);
	EXPECT_NE(NULL, strstr(out, "verify: ok"));
}

/*
 * Remove the failed target, put table `fix` into the layer under it (NULL:
 * leave it), check the device, create the target again: it starts idle at
 * the committed step, its PARAM window shows that step, and the next step
 * commits.
 */
static void recover(struct __test_metadata *_metadata, FIXTURE_DATA(faults) *self,
		    const char *layer, const char *fix)
{
	const uint64_t t = self->m.sb.committed_step;
	struct ckpt_status st;
	uint16_t *p = calloc(self->m.l.n_params, 2);

	ASSERT_NE(NULL, p);
	if (self->fd >= 0)
		close(self->fd);
	self->fd = -1;
	ck_remove(CK_NAME);
	if (fix) {
		ASSERT_EQ(0, swap(self, layer, fix));
	}
	expect_committed_on_disk(_metadata, self);
	ASSERT_EQ(0, ck_create_ckpt(&self->m, CK_NAME, self->backing, NULL));
	self->fd = ck_open_dm(CK_NAME);
	ASSERT_LE(0, self->fd);
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_IDLE, st.state);
	EXPECT_EQ(t, st.committed_step);
	EXPECT_EQ(0, st.first_io_error);
	ASSERT_EQ(0, ck_params(self->fd, &self->m, p, 0, self->m.l.n_params * 2));
	EXPECT_EQ(0, memcmp(p, self->m.plo[self->m.sb.committed_slot], self->m.l.n_params * 2));
	free(p);
	EXPECT_EQ(0, full_step(_metadata, self, t + 1, "after the fault"));
}

/*
 * Step 2 fails under `fault` (a table of the layer) switched on after half
 * the chunks (at_commit: after all of them, before COMMIT).
 */
static void fault_in_step(struct __test_metadata *_metadata, FIXTURE_DATA(faults) *self,
			  const char *fault, int at_commit)
{
	char fix[256];
	long e0;

	linear_table(self, fix, sizeof(fix));
	ASSERT_EQ(0, full_step(_metadata, self, 1, "step one"));
	make_grads(self);
	ASSERT_EQ(0, begin(self, 2));
	ASSERT_EQ(0, grads(self, 0, at_commit ? N_CHUNKS : N_CHUNKS / 2));
	e0 = ck_dm_events(CK_NAME);
	ASSERT_EQ(0, swap(self, BK, fault));
	if (at_commit) {
		EXPECT_EQ(-EIO, ck_commit(self->fd, 2, "two", 3));
	} else {
		EXPECT_EQ(-EIO, grads(self, N_CHUNKS / 2, N_CHUNKS));
	}
	forget_open_slot(&self->m);
	expect_failed(_metadata, self, e0, EIO, 2, 1);
	recover(_metadata, self, BK, fix);
}

/* ---------------------------------------------------------------- the faults */

TEST_F_TIMEOUT(faults, flakey_error_writes_mid_step, TIMEOUT_S)
{
	char t[256];

	snprintf(t, sizeof(t), "0 %llu flakey %s 0 0 1 1 error_writes",
		 (unsigned long long)self->sectors, ck_dev());
	fault_in_step(_metadata, self, t, 0);
}

TEST_F_TIMEOUT(faults, flakey_error_writes_at_commit, TIMEOUT_S)
{
	char t[256];

	snprintf(t, sizeof(t), "0 %llu flakey %s 0 0 1 1 error_writes",
		 (unsigned long long)self->sectors, ck_dev());
	fault_in_step(_metadata, self, t, 1);
}

TEST_F_TIMEOUT(faults, dm_error_mid_step, TIMEOUT_S)
{
	char t[256];

	snprintf(t, sizeof(t), "0 %llu error", (unsigned long long)self->sectors);
	fault_in_step(_metadata, self, t, 0);
}

TEST_F_TIMEOUT(faults, dm_error_at_commit, TIMEOUT_S)
{
	char t[256];

	snprintf(t, sizeof(t), "0 %llu error", (unsigned long long)self->sectors);
	fault_in_step(_metadata, self, t, 1);
}

/*
 * drop_writes over the records (not the superblocks): step 2's records are
 * lost without an error, its superblock lands and reads back, so COMMIT
 * succeeds and the device names a step whose state it never stored. No
 * target can see that when it happens (it would have to read every record
 * back before the commit). Step 3 reads the records it builds on: the slot
 * holds step 0's, which the record's step and sequence give away, so step 3
 * fails (EILSEQ) instead of building on them, and writes nothing. ckptctl
 * verify finds the damage and restore --rollback returns to step 1, which
 * is intact: training goes on from there.
 */
TEST_F_TIMEOUT(faults, flakey_drop_writes_is_caught_by_the_next_step, TIMEOUT_S)
{
	struct ckpt_status st;
	char drop[512], fix[256], out[4096];
	uint8_t *blk = ck_alloc(2 * CKPT_BLOCK);
	uint16_t *p = calloc(self->m.l.n_params, 2);
	long e0;
	int dfd;

	ASSERT_NE(NULL, blk);
	ASSERT_NE(NULL, p);
	linear_table(self, fix, sizeof(fix));
	snprintf(drop, sizeof(drop), "0 16 linear %s 0\n16 %llu flakey %s 16 0 1 1 drop_writes\n",
		 ck_dev(), (unsigned long long)self->sectors - 16, ck_dev());
	ASSERT_EQ(0, full_step(_metadata, self, 1, "step one"));
	make_grads(self);
	ASSERT_EQ(0, begin(self, 2));
	ASSERT_EQ(0, swap(self, BK, drop));
	EXPECT_EQ(0, grads(self, 0, N_CHUNKS));
	EXPECT_EQ(0, ck_commit(self->fd, 2, "two", 3));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(2, st.committed_step);
	ASSERT_EQ(0, swap(self, BK, fix));

	e0 = ck_dm_events(CK_NAME);
	make_grads(self);
	ASSERT_EQ(0, begin(self, 3));
	EXPECT_EQ(-EIO, grads(self, 0, 1));
	EXPECT_EQ(1, ck_kmsg_has("chunk 0 slot 0"));
	expect_failed(_metadata, self, e0, EILSEQ, 3, 2);

	/* nothing of step 3 was written: slot 1 still holds step 1 */
	close(self->fd);
	self->fd = -1;
	ck_remove(CK_NAME);
	EXPECT_EQ(2, ck_sh(out, sizeof(out), "ckptctl verify %s 2>&1", ck_dev()))
		TH_LOG("%s", out);
	/* restore --rollback wants the namespace itself, which the layer holds */
	ck_remove(BK);
	EXPECT_EQ(0, ck_sh(out, sizeof(out), "ckptctl restore --rollback %s 2>&1", ck_dev()))
		TH_LOG("%s", out);
	ASSERT_EQ(0, ck_create(BK, fix));
	EXPECT_EQ(0, ck_sh(out, sizeof(out), "ckptctl verify %s 2>&1", ck_dev()))
		TH_LOG("%s", out);
	/* the rollback wrote a superblock and restamped slot 1's record headers */
	dfd = open(ck_dev(), O_RDONLY | O_DIRECT);
	ASSERT_LE(0, dfd);
	ASSERT_EQ(0, ck_pread(dfd, blk, 2 * CKPT_BLOCK, 0));
	close(dfd);
	ASSERT_LE(0, ckpt_sb_pick(blk, blk + CKPT_BLOCK, ck_dev_bytes(ck_dev()), &self->m.sb));
	EXPECT_EQ(1, self->m.sb.committed_step);
	EXPECT_EQ(1, self->m.sb.committed_slot);
	EXPECT_EQ(0, memcmp(self->m.sb.blob, "step one", 8));
	memset(self->m.valid, 0, sizeof(self->m.valid));

	ASSERT_EQ(0, ck_create_ckpt(&self->m, CK_NAME, self->backing, NULL));
	self->fd = ck_open_dm(CK_NAME);
	ASSERT_LE(0, self->fd);
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_IDLE, st.state);
	EXPECT_EQ(1, st.committed_step);
	ASSERT_EQ(0, ck_params(self->fd, &self->m, p, 0, self->m.l.n_params * 2));
	EXPECT_EQ(0, memcmp(p, self->m.plo[1], self->m.l.n_params * 2));
	/* step 2 again, built on step 1's params and moments */
	EXPECT_EQ(0, full_step(_metadata, self, 2, "two again"));
	free(p);
	free(blk);
}

/*
 * drop_writes over the superblocks only: the records of step 2 land, its
 * superblock does not. A target that believed that commit would build step
 * 3 into slot 1, which the device still names as committed, and a crash
 * then leaves neither step intact. The commit reads the superblock back
 * and fails instead: COMMIT returns EIO, the device keeps step 1.
 */
TEST_F_TIMEOUT(faults, flakey_drop_writes_of_the_superblock_fails_the_commit, TIMEOUT_S)
{
	char drop[512], fix[256];
	long e0;

	linear_table(self, fix, sizeof(fix));
	snprintf(drop, sizeof(drop), "0 16 flakey %s 0 0 1 1 drop_writes\n16 %llu linear %s 16\n",
		 ck_dev(), (unsigned long long)self->sectors - 16, ck_dev());
	ASSERT_EQ(0, full_step(_metadata, self, 1, "step one"));
	make_grads(self);
	ASSERT_EQ(0, begin(self, 2));
	ASSERT_EQ(0, grads(self, 0, N_CHUNKS));
	e0 = ck_dm_events(CK_NAME);
	ASSERT_EQ(0, swap(self, BK, drop));
	EXPECT_EQ(-EIO, ck_commit(self->fd, 2, "two", 3));
	EXPECT_EQ(1, ck_kmsg_has("writing the superblock failed"));
	forget_open_slot(&self->m);
	expect_failed(_metadata, self, e0, EIO, 2, 1);
	recover(_metadata, self, BK, fix);
}

/* Bad blocks: an error segment over [lo, hi) sectors, linear elsewhere. */
static void bad_table(FIXTURE_DATA(faults) *self, uint64_t lo, uint64_t hi, char *t, size_t n)
{
	const unsigned long long s = self->sectors;

	if (lo)
		snprintf(t, n, "0 %llu linear %s 0\n%llu %llu error\n%llu %llu linear %s %llu\n",
			 (unsigned long long)lo, ck_dev(), (unsigned long long)lo,
			 (unsigned long long)(hi - lo), (unsigned long long)hi,
			 s - hi, ck_dev(), (unsigned long long)hi);
	else
		snprintf(t, n, "0 %llu error\n%llu %llu linear %s %llu\n",
			 (unsigned long long)hi, (unsigned long long)hi, s - hi, ck_dev(),
			 (unsigned long long)hi);
}

/* The committed record of chunk 5 is unreadable: the step fails on it. */
TEST_F_TIMEOUT(faults, bad_blocks_on_a_record, TIMEOUT_S)
{
	char bad[512], fix[256];
	uint64_t off;
	long e0;

	linear_table(self, fix, sizeof(fix));
	ASSERT_EQ(0, full_step(_metadata, self, 1, "step one"));
	off = ckpt_record_offset(&self->m.l, self->m.sb.committed_slot, 5);
	bad_table(self, off / 512 + 8, off / 512 + 16, bad, sizeof(bad));
	e0 = ck_dm_events(CK_NAME);
	ASSERT_EQ(0, swap(self, BK, bad));
	make_grads(self);
	ASSERT_EQ(0, begin(self, 2));
	EXPECT_EQ(0, grads(self, 0, 5));
	EXPECT_EQ(-EIO, grads(self, 5, 6));
	forget_open_slot(&self->m);
	expect_failed(_metadata, self, e0, EIO, 2, 1);
	recover(_metadata, self, BK, fix);
}

/*
 * Both superblock copies unwritable: COMMIT fails and says so, the status
 * keeps the old step; the constructor refuses the device while it is bad.
 */
TEST_F_TIMEOUT(faults, bad_blocks_on_the_superblocks, TIMEOUT_S)
{
	char bad[512], fix[256], out[1024];
	long e0;

	linear_table(self, fix, sizeof(fix));
	ASSERT_EQ(0, full_step(_metadata, self, 1, "step one"));
	bad_table(self, 0, 2 * CKPT_BLOCK / 512, bad, sizeof(bad));
	make_grads(self);
	ASSERT_EQ(0, begin(self, 2));
	ASSERT_EQ(0, grads(self, 0, N_CHUNKS));
	e0 = ck_dm_events(CK_NAME);
	ASSERT_EQ(0, swap(self, BK, bad));
	EXPECT_EQ(-EIO, ck_commit(self->fd, 2, "two", 3));
	forget_open_slot(&self->m);
	expect_failed(_metadata, self, e0, EIO, 2, 1);

	close(self->fd);
	self->fd = -1;
	ck_remove(CK_NAME);
	ck_kmsg_clear();
	EXPECT_NE(0, ck_create_ckpt(&self->m, CK_NAME, self->backing, NULL));
	EXPECT_EQ(1, ck_kmsg_has("Cannot read the superblock"));
	ck_sh(out, sizeof(out), "dmsetup remove --noudevsync %s 2>&1", CK_NAME);
	recover(_metadata, self, BK, fix);
}

/*
 * A layer with target mid over sectors [lo, hi) of the namespace (mid names
 * its own offset: lo), linear elsewhere.
 */
static void layer_table(FIXTURE_DATA(faults) *self, uint64_t lo, uint64_t hi, const char *mid,
			char *t, size_t n)
{
	const unsigned long long s = self->sectors;
	int k = 0;

	if (lo)
		k = snprintf(t, n, "0 %llu linear %s 0\n", (unsigned long long)lo, ck_dev());
	snprintf(t + k, n - k, "%llu %llu %s\n%llu %llu linear %s %llu\n",
		 (unsigned long long)lo, (unsigned long long)(hi - lo), mid,
		 (unsigned long long)hi, s - hi, ck_dev(), (unsigned long long)hi);
}

/* A dm-flakey over the sectors from lo on with these features ("": every I/O fails). */
static void flakey(char *mid, size_t n, uint64_t lo, const char *features)
{
	snprintf(mid, n, "flakey %s %llu 0 1 %s", ck_dev(), (unsigned long long)lo, features);
}

/*
 * The rollback message from step 2 under table `fault` of the layer, which
 * fails one of its I/Os before the superblock write: EIO, and the target
 * is as before (idle at step 2, no I/O error). With the fault gone, the
 * rollback runs again to step 1, and step 2 is taken again.
 */
static void rollback_fails_before_sb(struct __test_metadata *_metadata,
				     FIXTURE_DATA(faults) *self, const char *fault,
				     const char *what)
{
	struct ckpt_status st;
	char fix[256];

	TH_LOG("rollback: %s", what);
	linear_table(self, fix, sizeof(fix));
	ASSERT_EQ(0, swap(self, BK, fault));
	EXPECT_EQ(-EIO, ck_dm_message(CK_NAME, "rollback"));
	ASSERT_EQ(0, swap(self, BK, fix));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_IDLE, st.state);
	EXPECT_EQ(2, st.committed_step);
	EXPECT_EQ(0, st.first_io_error);
	EXPECT_EQ(1, ck_kmsg_has("rollback failed"));
	ck_kmsg_clear();
	ASSERT_EQ(0, ck_dm_message(CK_NAME, "rollback"));
	ck_model_rollback(&self->m, "step one");
	ASSERT_EQ(0, full_step(_metadata, self, 2, "step two"));
}

/* The writes and flushes a dm-delay of table `name` holds back now (its status), or -1. */
static int held_back(const char *name)
{
	char out[1024], *p;
	unsigned int r, w, f;

	if (ck_sh(out, sizeof(out), "dmsetup status %s 2>&1", name))
		return -1;
	p = strstr(out, " delay ");
	if (!p || sscanf(p, " delay %u %u %u", &r, &w, &f) != 3)
		return -1;
	return (int)(w + f);
}

/*
 * A rollback failing at each of its I/Os. Before the superblock write (the
 * older copy's read, a record's read, a record header's re-stamp, the
 * flush): refused, nothing lost (rollback_fails_before_sb). After it: the
 * superblock write reaches the device, and the read-back fails. The
 * superblocks' sectors of the layer are a dm-delay over SB_LOW, which holds
 * writes and flushes back 10 s; once it holds one (the rollback's flush or
 * its superblock write: after the last read of a superblock before the
 * write either way), SB_LOW becomes a dm-delay that sends reads to an error
 * target and writes to the device. (Swapping the layer itself would release
 * what it holds in its presuspend, and the read-back could pass before the
 * new table: a race that 6.12 lost.) The device now commits step 1 in slot 1 while the
 * target's superblock says step 2 in slot 0: the target must fail, not take
 * step 3 into slot 0, which the device names as committed. Removed and
 * created again, the target goes on from step 1, and the device verifies.
 */
TEST_F_TIMEOUT(faults, rollback_fails_at_each_io, 2 * TIMEOUT_S)
{
	const struct ckpt_regions *l = &self->m.l;
	const uint64_t sb_end = 2 * CKPT_BLOCK / 512;
	char mid[256], t[1024], fix[256];
	uint8_t *blk = ck_alloc(2 * CKPT_BLOCK);
	struct ckpt_sb disk;
	uint64_t off;
	long e0;
	pid_t pid;
	int st, dfd;

	ASSERT_NE(NULL, blk);
	ASSERT_EQ(1, ck_dm_has_target("delay")) TH_LOG("dm-delay missing in the guest");
	linear_table(self, fix, sizeof(fix));
	ASSERT_EQ(0, full_step(_metadata, self, 1, "step one"));
	ASSERT_EQ(0, full_step(_metadata, self, 2, "step two"));

	flakey(mid, sizeof(mid), 0, "");
	layer_table(self, 0, sb_end, mid, t, sizeof(t));
	rollback_fails_before_sb(_metadata, self, t, "the older superblock copy unreadable");

	off = ckpt_record_offset(l, self->m.sb.committed_slot ^ 1, 5) / 512;
	layer_table(self, off, off + 8, "error", t, sizeof(t));
	rollback_fails_before_sb(_metadata, self, t, "a record of step 1 unreadable");

	off = ckpt_record_offset(l, self->m.sb.committed_slot ^ 1, 3) / 512;
	flakey(mid, sizeof(mid), off, "1 error_writes");
	layer_table(self, off, off + 8, mid, t, sizeof(t));
	rollback_fails_before_sb(_metadata, self, t, "a record header's re-stamp fails");

	/* writes the rollback never makes: only its flush reaches the flakey */
	off = ckpt_plo_offset(l, self->m.sb.committed_slot, 0) / 512;
	flakey(mid, sizeof(mid), off, "1 error_writes");
	layer_table(self, off, off + 8, mid, t, sizeof(t));
	rollback_fails_before_sb(_metadata, self, t, "the flush fails");

	/* the superblock write held back, then the read-back fails */
	snprintf(t, sizeof(t), "0 %llu linear %s 0", (unsigned long long)sb_end, ck_dev());
	ASSERT_EQ(0, ck_create(SB_LOW, t));
	snprintf(t, sizeof(t), "0 %llu error", (unsigned long long)sb_end);
	ASSERT_EQ(0, ck_create(SB_ERR, t));
	snprintf(mid, sizeof(mid), "delay %s 0 0 %s 0 10000 %s 0 10000", "/dev/mapper/" SB_LOW,
		 "/dev/mapper/" SB_LOW, "/dev/mapper/" SB_LOW);
	layer_table(self, 0, sb_end, mid, t, sizeof(t));
	ASSERT_EQ(0, swap(self, BK, t));
	e0 = ck_dm_events(CK_NAME);
	pid = fork();
	ASSERT_LE(0, pid);
	if (!pid)
		_exit(-ck_dm_message(CK_NAME, "rollback"));
	for (int i = 0; i < 150 && held_back(BK) < 1; i++)
		usleep(100 * 1000);
	ASSERT_LE(1, held_back(BK)) TH_LOG("no write or flush held back within 15 s");
	snprintf(t, sizeof(t), "0 %llu delay %s 0 0 %s 0 0", (unsigned long long)sb_end,
		 "/dev/mapper/" SB_ERR, ck_dev());
	ASSERT_EQ(0, swap(self, SB_LOW, t));
	ASSERT_LE(1, held_back(BK)) TH_LOG("what was held went on before SB_LOW's swap");
	ASSERT_EQ(pid, waitpid(pid, &st, 0));
	EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == EIO) TH_LOG("rollback: status %#x", st);
	EXPECT_EQ(1, ck_kmsg_has("writing the superblock failed"));

	/* the device commits step 1 in the slot step 2 came from */
	dfd = open(ck_dev(), O_RDONLY | O_DIRECT);
	ASSERT_LE(0, dfd);
	ASSERT_EQ(0, ck_pread(dfd, blk, 2 * CKPT_BLOCK, 0));
	close(dfd);
	ASSERT_LE(0, ckpt_sb_pick(blk, blk + CKPT_BLOCK, ck_dev_bytes(ck_dev()), &disk));
	EXPECT_EQ(1, disk.committed_step);
	EXPECT_EQ(self->m.sb.committed_slot ^ 1, disk.committed_slot);
	ck_model_rollback(&self->m, "step one");
	EXPECT_EQ(self->m.sb.sequence, disk.sequence);

	/* the target failed with its step 2; it takes no step 3 */
	expect_failed(_metadata, self, e0, EIO, 3, 2);
	recover(_metadata, self, BK, fix);
	ck_remove(SB_LOW);
	ck_remove(SB_ERR);
	free(blk);
}

/*
 * A backing device shorter than the superblock says (a dm-linear cut short,
 * as an lvreduce would leave it): the constructor refuses it with a clear
 * error and writes nothing.
 */
TEST_F_TIMEOUT(faults, short_backing_device_is_refused, TIMEOUT_S)
{
	char t[256];

	ASSERT_EQ(0, full_step(_metadata, self, 1, "step one"));
	close(self->fd);
	self->fd = -1;
	ck_remove(CK_NAME);
	snprintf(t, sizeof(t), "0 %llu linear %s 0",
		 (unsigned long long)(self->m.l.dev_bytes / 512 - 8), ck_dev());
	ASSERT_EQ(0, ck_create(SHORT, t));
	ck_kmsg_clear();
	EXPECT_NE(0, ck_create_ckpt(&self->m, CK_NAME, "/dev/mapper/" SHORT, NULL));
	EXPECT_EQ(1, ck_kmsg_has("ckpt: Superblock: backing device smaller than the layout"));
	ck_remove(CK_NAME);
	ck_remove(SHORT);
	recover(_metadata, self, BK, NULL);
}

/*
 * A thin pool runs out of data space (error_if_no_space) while step 1 writes
 * blocks it has not provisioned: the image is copied onto a thin volume
 * except for the tail of slot 1's records, into a pool just large enough
 * for what was copied. The step fails, the committed step (provisioned)
 * stays; growing the pool's data device removes the fault and training
 * goes on.
 */
TEST_F_TIMEOUT(faults, thin_pool_out_of_space, TIMEOUT_S)
{
	const uint64_t at = 2097152;	/* 1 GiB into the namespace */
	const uint64_t blk = 65536;	/* the pool's block size */
	char t[512], out[1024];
	uint64_t copied, data;
	uint8_t *b;
	long e0;
	int fd;

	ASSERT_EQ(1, ck_dm_has_target("thin-pool")) TH_LOG("dm-thin-pool missing in the guest");
	close(self->fd);
	self->fd = -1;
	ck_remove(CK_NAME);
	/* everything before slot 1's records, rounded up to whole pool blocks */
	copied = (self->m.l.rec_off[1] + blk - 1) / blk * blk;
	ASSERT_LT(copied, self->m.l.dev_bytes);
	data = copied / 512;
	b = ck_alloc(copied);
	ASSERT_NE(NULL, b);

	snprintf(t, sizeof(t), "0 16384 linear %s %llu", ck_dev(), (unsigned long long)at);
	ASSERT_EQ(0, ck_create(T_META, t));
	ASSERT_EQ(0, ck_write_dev("/dev/mapper/" T_META, b, CKPT_BLOCK, 0));
	snprintf(t, sizeof(t), "0 %llu linear %s %llu", (unsigned long long)data, ck_dev(),
		 (unsigned long long)at + 16384);
	ASSERT_EQ(0, ck_create(T_DATA, t));
	snprintf(t, sizeof(t), "0 %llu thin-pool /dev/mapper/%s /dev/mapper/%s %llu 0 1 error_if_no_space",
		 (unsigned long long)data, T_META, T_DATA, (unsigned long long)blk / 512);
	ASSERT_EQ(0, ck_create(T_POOL, t));
	ASSERT_EQ(0, ck_sh(out, sizeof(out), "dmsetup message %s 0 create_thin 0 2>&1", T_POOL));
	snprintf(t, sizeof(t), "0 %llu thin /dev/mapper/%s 0",
		 (unsigned long long)(self->m.l.dev_bytes + blk) / 512, T_POOL);
	ASSERT_EQ(0, ck_create(T_VOL, t));

	/* the image of the fixture's format, as far as it fits */
	fd = open(ck_dev(), O_RDONLY | O_DIRECT);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, ck_pread(fd, b, copied, 0));
	close(fd);
	ASSERT_EQ(0, ck_write_dev("/dev/mapper/" T_VOL, b, copied, 0));
	free(b);
	self->m.dev = "/dev/mapper/" T_VOL;
	snprintf(self->backing, sizeof(self->backing), "%s", self->m.dev);
	ASSERT_EQ(0, ck_create_ckpt(&self->m, CK_NAME, self->backing, NULL));
	self->fd = ck_open_dm(CK_NAME);
	ASSERT_LE(0, self->fd);

	e0 = ck_dm_events(CK_NAME);
	make_grads(self);
	ASSERT_EQ(0, begin(self, 1));
	EXPECT_EQ(-EIO, grads(self, 0, N_CHUNKS));
	forget_open_slot(&self->m);
	expect_failed(_metadata, self, e0, 0, 1, 0);
	ASSERT_EQ(0, ck_sh(out, sizeof(out), "dmsetup status %s 2>&1", T_POOL));
	TH_LOG("pool: %s", out);

	/* the fault goes: the pool's data device grows */
	close(self->fd);
	self->fd = -1;
	ck_remove(CK_NAME);
	snprintf(t, sizeof(t), "0 4096 linear %s %llu", ck_dev(), (unsigned long long)at + 16384);
	ASSERT_EQ(0, swap(self, T_DATA, t));
	snprintf(t, sizeof(t), "0 4096 thin-pool /dev/mapper/%s /dev/mapper/%s %llu 0 1 error_if_no_space",
		 T_META, T_DATA, (unsigned long long)blk / 512);
	ASSERT_EQ(0, swap(self, T_POOL, t));
	recover(_metadata, self, T_POOL, NULL);
}

/*
 * The target goes away with a step open: `dmsetup remove --force` swaps in
 * an error table under the open file and drops the instance; a table reload
 * of the ckpt device starts the new instance from the superblock. Either
 * way the step is gone and the committed one stays.
 */
TEST_F_TIMEOUT(faults, remove_force_with_a_step_open, TIMEOUT_S)
{
	char out[1024];

	ASSERT_EQ(0, full_step(_metadata, self, 1, "step one"));
	make_grads(self);
	ASSERT_EQ(0, begin(self, 2));
	ASSERT_EQ(0, grads(self, 0, N_CHUNKS / 2));
	ck_sh(out, sizeof(out), "dmsetup remove --force --noudevsync %s 2>&1", CK_NAME);
	TH_LOG("remove --force: %s", out);
	EXPECT_EQ(-EIO, grads(self, N_CHUNKS / 2, N_CHUNKS));
	EXPECT_EQ(-EIO, ck_commit(self->fd, 2, NULL, 0));
	forget_open_slot(&self->m);
	recover(_metadata, self, BK, NULL);
}

TEST_F_TIMEOUT(faults, table_swap_with_a_step_open, TIMEOUT_S)
{
	struct ckpt_status st;
	char t[256];

	ASSERT_EQ(0, full_step(_metadata, self, 1, "step one"));
	make_grads(self);
	ASSERT_EQ(0, begin(self, 2));
	ASSERT_EQ(0, grads(self, 0, N_CHUNKS / 2));
	snprintf(t, sizeof(t), "0 %llu ckpt %s", (unsigned long long)ck_sectors(&self->m),
		 self->backing);
	ASSERT_EQ(0, swap(self, CK_NAME, t));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_IDLE, st.state);
	EXPECT_EQ(1, st.committed_step);
	EXPECT_EQ(-EIO, grads(self, N_CHUNKS / 2, N_CHUNKS));
	EXPECT_EQ(-EIO, ck_commit(self->fd, 2, NULL, 0));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(1, st.committed_step);
	forget_open_slot(&self->m);
	recover(_metadata, self, BK, NULL);
}

TEST_HARNESS_MAIN
