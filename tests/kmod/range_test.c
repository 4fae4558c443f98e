// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * dm-ckpt's RANGE command (feature COUNTS) through the virtual device: a
 * skipped block keeps p, m, v and its step count bit for bit (its p_lo is
 * rounded again from p), a block given a count of its own is updated with
 * that count's bias correction and reaches it, the others with the open
 * step's; the backing device must hold, byte for byte, what the core's scalar
 * reference computes block by block (ck_model_step_modes), counts included.
 * A block whose count does not match its bias correction makes COMMIT refuse
 * the step. Hostile RANGE commands (past the end, overlapping, zero length,
 * unaligned, unknown flags, bad counts or hyperparameters, garbage) are
 * refused with their error and change nothing.
 */
#include "ckpt_kmod.h"
#include "kselftest_harness.h"

#define N_CHUNKS 4
#define SHIFT 13		/* 8192 params: 4 blocks per chunk */
#define BPC (1u << (SHIFT - CKPT_BLOCK_SHIFT))
#define N_BLOCKS (N_CHUNKS * BPC)
#define BLOCK_BYTES (2u * CKPT_TENSOR_ALIGN)	/* a block's gradient bytes */
#define LR 1e-2
#define BETA1 0.9
#define BETA2 0.999

FIXTURE(range) {
	struct ck_model m;
	int fd;
	uint16_t *grad;
	struct ckpt_hparams hp;
	uint32_t gs;
	struct ck_rng rng;
	uint64_t window;
	/* what the open step's RANGE commands asked for, as the core keeps it */
	uint8_t modes[N_BLOCKS];
	struct ckpt_bias bias[CKPT_BIAS_MAX];
	uint32_t n_bias;
};

FIXTURE_SETUP(range)
{
	struct ckpt_geometry g = ck_geo(N_CHUNKS, SHIFT, 1, CKPT_DTYPE_BF16);

	ck_remove(CK_NAME);
	ASSERT_EQ(0, ck_format_features(&self->m, ck_dev(), &g, 21,
					CKPT_FEATURE_INCOMPAT_PLO_CRC | CKPT_FEATURE_INCOMPAT_COUNTS));
	self->rng.s = 7;
	self->window = self->m.l.window_bytes;
	ASSERT_EQ(N_BLOCKS * BLOCK_BYTES, self->window);
	self->grad = calloc(self->m.l.n_params, 2);
	self->gs = ck_f32(0.75);
	ck_kmsg_clear();
	ASSERT_EQ(0, ck_create_ckpt(&self->m, CK_NAME, ck_dev(), NULL));
	self->fd = ck_open_dm(CK_NAME);
	ASSERT_LE(0, self->fd);
}

FIXTURE_TEARDOWN(range)
{
	if (self->fd >= 0)
		close(self->fd);
	ck_remove(CK_NAME);
	EXPECT_EQ(0, ck_kmsg_bug());
	free(self->grad);
	ck_model_free(&self->m);
}

static void make_grads(FIXTURE_DATA(range) *self)
{
	ck_bf16_grads(&self->rng, self->grad, self->m.l.n_params);
}

static int begin(FIXTURE_DATA(range) *self, uint64_t t)
{
	self->hp = ck_hparams(LR, BETA1, BETA2, 1e-8, 0.05, 0, t);
	memset(self->modes, 0, sizeof(self->modes));
	self->n_bias = 0;
	return ck_begin(self->fd, t, self->gs, &self->hp, 1);
}

/* A range of blocks [first, first + n): skipped (count 0) or bias-corrected for count. */
static struct ckpt_range blocks(uint32_t first, uint32_t n, uint64_t count)
{
	struct ckpt_range r;
	struct ckpt_hparams h = ck_hparams(LR, BETA1, BETA2, 1e-8, 0.05, 0, count ? count : 1);

	memset(&r, 0, sizeof(r));
	r.off = (uint64_t)first * BLOCK_BYTES;
	r.len = (uint64_t)n * BLOCK_BYTES;
	r.count = count;
	r.step_size = h.step_size;
	r.bc2_sqrt = h.bc2_sqrt;
	r.flags = count ? 0 : CKPT_RANGE_SKIP;
	return r;
}

static int send_range(FIXTURE_DATA(range) *self, uint64_t t, const struct ckpt_range *r, uint32_t n)
{
	struct ckpt_cmd *cmd = calloc(1, sizeof(*cmd));
	int ret;

	cmd->opcode = CKPT_OP_RANGE;
	cmd->step = t;
	cmd->n_ranges = n;
	memcpy(cmd->ranges, r, n * sizeof(*r));
	ret = ck_send(self->fd, cmd);
	free(cmd);
	return ret;
}

/* A RANGE the target took: the model marks its blocks as the core does. */
static int range(FIXTURE_DATA(range) *self, uint64_t t, const struct ckpt_range *r, uint32_t n)
{
	uint32_t i, b;
	int ret = send_range(self, t, r, n);

	for (i = 0; !ret && i < n; i++) {
		uint8_t mode = CKPT_MODE_SKIP;

		if (!(r[i].flags & CKPT_RANGE_SKIP)) {
			self->bias[self->n_bias].count = r[i].count;
			self->bias[self->n_bias].step_size = r[i].step_size;
			self->bias[self->n_bias].bc2_sqrt = r[i].bc2_sqrt;
			mode = (uint8_t)++self->n_bias;
		}
		for (b = 0; b < r[i].len / BLOCK_BYTES; b++)
			self->modes[r[i].off / BLOCK_BYTES + b] = mode;
	}
	return ret;
}

static int verify(struct __test_metadata *_metadata, FIXTURE_DATA(range) *self)
{
	char why[256];

	if (ck_model_verify(&self->m, why, sizeof(why))) {
		TH_LOG("backing device: %s", why);
		return -1;
	}
	return 0;
}

/* The open step t's gradients, in one write per chunk, and its commit; the model follows. */
static int finish_step(struct __test_metadata *_metadata, FIXTURE_DATA(range) *self, uint64_t t)
{
	uint32_t c;
	int ret;

	make_grads(self);
	for (c = 0; c < N_CHUNKS; c++) {
		ret = ck_grad(self->fd, &self->m, self->grad, (uint64_t)c * BPC * BLOCK_BYTES,
			      BPC * BLOCK_BYTES);
		if (ret) {
			TH_LOG("gradient of chunk %u: %s", c, strerror(-ret));
			return ret;
		}
	}
	ret = ck_commit(self->fd, t, NULL, 0);
	if (ret) {
		TH_LOG("commit %llu: %s", (unsigned long long)t, strerror(-ret));
		return ret;
	}
	ck_model_step_modes(&self->m, t, &self->hp, self->gs, self->grad, NULL, self->modes,
			    self->bias);
	ck_model_commit(&self->m, t, NULL, 0);
	return verify(_metadata, self);
}

static uint64_t count_of(FIXTURE_DATA(range) *self, uint32_t block)
{
	return self->m.counts[self->m.sb.committed_slot][block];
}

#define EXPECT_REFUSED(call, err) do {						\
		EXPECT_EQ(-EIO, (call));					\
		ASSERT_EQ(0, ck_status(self->fd, &st));				\
		EXPECT_EQ(CKPT_RESULT_REJECTED, st.last_result);		\
		EXPECT_EQ((err), st.last_error);				\
		EXPECT_EQ(CKPT_STATE_OPEN, st.state);				\
	} while (0)

TEST_F(range, skipped_blocks_and_own_counts)
{
	static const int only_chunk_1[N_CHUNKS] = { 0, 1, 0, 0 };
	struct ckpt_status st;
	struct ckpt_range r[3];

	ASSERT_EQ(0, begin(self, 1));
	ASSERT_EQ(0, finish_step(_metadata, self, 1));

	/* step 2: blocks 1-2 (chunk 0) and 9 (chunk 2) skipped */
	ASSERT_EQ(0, begin(self, 2));
	r[0] = blocks(1, 2, 0);
	r[1] = blocks(9, 1, 0);
	ASSERT_EQ(0, range(self, 2, r, 2));
	ASSERT_EQ(0, finish_step(_metadata, self, 2));
	EXPECT_EQ(1, count_of(self, 1));
	EXPECT_EQ(1, count_of(self, 9));
	EXPECT_EQ(2, count_of(self, 0));
	EXPECT_EQ(2, count_of(self, 10));

	/* step 3: they catch up with their own count 2; block 14 skipped */
	ASSERT_EQ(0, begin(self, 3));
	r[0] = blocks(1, 2, 2);
	r[1] = blocks(9, 1, 2);
	r[2] = blocks(14, 1, 0);
	ASSERT_EQ(0, range(self, 3, r, 3));
	ASSERT_EQ(0, finish_step(_metadata, self, 3));
	EXPECT_EQ(2, count_of(self, 2));
	EXPECT_EQ(2, count_of(self, 14));
	EXPECT_EQ(3, count_of(self, 15));

	/*
	 * step 4 without a RANGE: blocks 1, 2, 9 and 14 are at count 2, not 3;
	 * their chunks are not written and COMMIT refuses the step (E_STEP),
	 * which stays open for ABORT; nothing committed changes.
	 */
	ASSERT_EQ(0, begin(self, 4));
	make_grads(self);
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 0, self->window));
	EXPECT_REFUSED(ck_commit(self->fd, 4, NULL, 0), CKPT_E_STEP);
	ASSERT_EQ(0, ck_abort(self->fd, 4));
	/* only chunk 1 (blocks 4-7, all at count 3) was written, uncommitted */
	ck_model_step_modes(&self->m, 4, &self->hp, self->gs, self->grad, only_chunk_1,
			    self->modes, self->bias);
	ASSERT_EQ(0, verify(_metadata, self));

	/* step 4 again, each lagging block with its own count */
	ASSERT_EQ(0, begin(self, 4));
	r[0] = blocks(1, 2, 3);
	r[1] = blocks(9, 1, 3);
	r[2] = blocks(14, 1, 3);
	ASSERT_EQ(0, range(self, 4, r, 3));
	ASSERT_EQ(0, finish_step(_metadata, self, 4));
	EXPECT_EQ(3, count_of(self, 1));
	EXPECT_EQ(4, count_of(self, 0));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(4, st.committed_step);
	EXPECT_EQ(CKPT_RESULT_COMMITTED, st.last_result);
}

/* The model really sees a RANGE: a skipped block's bytes differ from an updated one's. */
TEST_F(range, reference_tells_skip_from_update)
{
	uint8_t none[N_BLOCKS] = { 0 };
	struct ck_model copy;
	struct ckpt_range r = blocks(5, 1, 0);
	const uint32_t dst = self->m.sb.committed_slot ^ 1;

	ASSERT_EQ(0, begin(self, 1));
	ASSERT_EQ(0, range(self, 1, &r, 1));
	make_grads(self);
	copy = self->m;
	copy.state[dst] = calloc(self->m.l.n_params * 3, 4);
	copy.plo[dst] = calloc(self->m.l.n_params, 2);
	copy.counts[dst] = calloc(N_BLOCKS, 8);
	ck_model_step_modes(&copy, 1, &self->hp, self->gs, self->grad, NULL, none, self->bias);
	ck_model_step_modes(&self->m, 1, &self->hp, self->gs, self->grad, NULL, self->modes,
			    self->bias);
	EXPECT_NE(0, memcmp(copy.state[dst] + (size_t)1 * 3 * self->m.cp + CKPT_TENSOR_ALIGN,
			    self->m.state[dst] + (size_t)1 * 3 * self->m.cp + CKPT_TENSOR_ALIGN,
			    4 * CKPT_TENSOR_ALIGN));
	EXPECT_EQ(1, copy.counts[dst][5]);
	EXPECT_EQ(0, self->m.counts[dst][5]);
	free(copy.state[dst]);
	free(copy.plo[dst]);
	free(copy.counts[dst]);
	ASSERT_EQ(0, ck_abort(self->fd, 1));
}

TEST_F(range, hostile_ranges_change_nothing)
{
	static const int only_chunk_0[N_CHUNKS] = { 1, 0, 0, 0 };
	struct ckpt_status st;
	struct ckpt_range r[2];
	uint8_t *junk = ck_alloc(CKPT_BLOCK);
	uint64_t i;

	ASSERT_EQ(0, begin(self, 1));
	ASSERT_EQ(0, finish_step(_metadata, self, 1));

	/* no open step */
	r[0] = blocks(0, 1, 0);
	EXPECT_EQ(-EIO, send_range(self, 2, r, 1));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_E_STATE, st.last_error);

	ASSERT_EQ(0, begin(self, 2));
	/* another step than the open one */
	EXPECT_REFUSED(send_range(self, 3, r, 1), CKPT_E_STEP);
	/* past the end: starting at it, running over it, a length that wraps */
	r[0] = blocks(N_BLOCKS, 1, 0);
	EXPECT_REFUSED(send_range(self, 2, r, 1), CKPT_E_RANGE);
	r[0] = blocks(N_BLOCKS - 1, 2, 0);
	EXPECT_REFUSED(send_range(self, 2, r, 1), CKPT_E_RANGE);
	r[0] = blocks(1, 1, 0);
	r[0].len = ~(uint64_t)(BLOCK_BYTES - 1);
	EXPECT_REFUSED(send_range(self, 2, r, 1), CKPT_E_RANGE);
	r[0] = blocks(0, 1, 0);
	r[0].off = 1ull << 63;
	EXPECT_REFUSED(send_range(self, 2, r, 1), CKPT_E_RANGE);
	/* zero length */
	r[0] = blocks(3, 0, 0);
	EXPECT_REFUSED(send_range(self, 2, r, 1), CKPT_E_RANGE);
	/* not whole blocks */
	r[0] = blocks(3, 1, 0);
	r[0].off += 512;
	EXPECT_REFUSED(send_range(self, 2, r, 1), CKPT_E_ALIGN);
	r[0] = blocks(3, 1, 0);
	r[0].len = 512;
	EXPECT_REFUSED(send_range(self, 2, r, 1), CKPT_E_ALIGN);
	/* overlapping in one command; the valid first range is not kept either */
	r[0] = blocks(0, 2, 0);
	r[1] = blocks(1, 2, 1);
	EXPECT_REFUSED(send_range(self, 2, r, 2), CKPT_E_TWICE);
	/* unknown flags */
	r[0] = blocks(0, 1, 0);
	r[0].flags |= 1u << 7;
	EXPECT_REFUSED(send_range(self, 2, r, 1), CKPT_E_INVAL);
	/* counts: none, beyond the open step */
	r[0] = blocks(0, 1, 1);
	r[0].count = 0;
	EXPECT_REFUSED(send_range(self, 2, r, 1), CKPT_E_STEP);
	r[0] = blocks(0, 1, 3);
	EXPECT_REFUSED(send_range(self, 2, r, 1), CKPT_E_STEP);
	/* a bias correction that is not finite */
	r[0] = blocks(0, 1, 1);
	r[0].step_size = 0x7fc00000;
	EXPECT_REFUSED(send_range(self, 2, r, 1), CKPT_E_HPARAM);
	r[0] = blocks(0, 1, 1);
	r[0].bc2_sqrt = 0x7f800000;
	EXPECT_REFUSED(send_range(self, 2, r, 1), CKPT_E_HPARAM);
	/* garbage in the control block */
	for (i = 0; i < CKPT_BLOCK; i++)
		junk[i] = (uint8_t)ck_next(&self->rng);
	EXPECT_EQ(-EIO, ck_pwrite(self->fd, junk, 512, 0));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_RESULT_REJECTED, st.last_result);
	EXPECT_NE(0, st.last_error);
	EXPECT_EQ(CKPT_STATE_OPEN, st.state);
	/* a block whose chunk already has its gradient (chunk 0, updated uncommitted) */
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 0, BPC * BLOCK_BYTES));
	ck_model_step_modes(&self->m, 2, &self->hp, self->gs, self->grad, only_chunk_0, self->modes,
			    self->bias);
	r[0] = blocks(1, 1, 0);
	EXPECT_REFUSED(send_range(self, 2, r, 1), CKPT_E_TWICE);
	/* a block a RANGE of this step named already */
	r[0] = blocks(6, 1, 0);
	ASSERT_EQ(0, range(self, 2, r, 1));
	r[0] = blocks(5, 2, 1);
	EXPECT_REFUSED(send_range(self, 2, r, 1), CKPT_E_TWICE);
	free(junk);

	/*
	 * Nothing committed changed, and nothing of the aborted step's RANGE
	 * stays: step 2 again without one updates every block.
	 */
	ASSERT_EQ(0, verify(_metadata, self));
	ASSERT_EQ(0, ck_abort(self->fd, 2));
	ASSERT_EQ(0, begin(self, 2));
	ASSERT_EQ(0, finish_step(_metadata, self, 2));
	for (i = 0; i < N_BLOCKS; i++)
		EXPECT_EQ(2, count_of(self, (uint32_t)i));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(2, st.committed_step);
}

TEST_HARNESS_MAIN
