// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * dm-ckpt steps through the virtual device and through dmsetup messages:
 * the backing device must hold, byte for byte, what the core's scalar
 * reference computes (the same records and superblocks the userspace engine
 * writes); bad commands and writes are refused with nothing changed;
 * overflow, abort, suspend/resume with an open step, reload, restore after
 * remove, staging limits and backing I/O errors behave as the design says.
 */
#include "ckpt_kmod.h"
#include <pthread.h>
#include <stddef.h>
#include "kselftest_harness.h"

#define N_CHUNKS 8
#define SHIFT 11		/* 2048 params, 4 KiB of gradients per chunk */
#define N_GROUPS 2

FIXTURE(step) {
	struct ck_model m;
	int fd;
	uint16_t *grad;
	struct ckpt_hparams hp[N_GROUPS];
	uint32_t gs;
	struct ck_rng rng;
	uint64_t cb, window;
};

FIXTURE_VARIANT(step) {
	uint32_t dtype;
};

FIXTURE_VARIANT_ADD(step, bf16) {
	.dtype = CKPT_DTYPE_BF16,
};

FIXTURE_VARIANT_ADD(step, fp16) {
	.dtype = CKPT_DTYPE_FP16,
};

static int create_default(struct ck_model *m, const char *opts)
{
	return ck_create_ckpt(m, CK_NAME, ck_dev(), opts);
}

FIXTURE_SETUP(step)
{
	struct ckpt_geometry g = ck_geo(N_CHUNKS, SHIFT, N_GROUPS, variant->dtype);

	ck_remove(CK_NAME);
	ck_remove("ckpt_kt_bk");
	ASSERT_EQ(0, ck_format(&self->m, ck_dev(), &g, 11));
	self->rng.s = 42;
	self->cb = self->m.l.plo_chunk_bytes;
	self->window = self->m.l.window_bytes;
	self->grad = calloc(self->m.l.n_params, 2);
	ck_kmsg_clear();
	ASSERT_EQ(0, create_default(&self->m, NULL));
	self->fd = ck_open_dm(CK_NAME);
	ASSERT_LE(0, self->fd);
}

FIXTURE_TEARDOWN(step)
{
	if (self->fd >= 0)
		close(self->fd);
	ck_remove(CK_NAME);
	ck_remove("ckpt_kt_bk");
	EXPECT_EQ(0, ck_kmsg_bug());
	free(self->grad);
	ck_model_free(&self->m);
}

/* Step t's hyperparameters: group 0 AdamW, group 1 Adam with L2. */
static void step_params(FIXTURE_DATA(step) *self, uint64_t t)
{
	double sched = 0.5 * (1.0 + cos((double)t * 0.1));

	self->hp[0] = ck_hparams(1e-3 * (0.1 + 0.9 * sched), 0.9, 0.999, 1e-8, 0.05, 0, t);
	self->hp[1] = ck_hparams(2e-3, 0.85, 0.995, 1e-8, 0.01, 1, t);
	self->gs = ck_f32(self->m.sb.geo.dtype == CKPT_DTYPE_FP16 ? 1.0 / 1024 : 0.75);
}

static void make_grads(FIXTURE_DATA(step) *self)
{
	const int fp16 = self->m.sb.geo.dtype == CKPT_DTYPE_FP16;
	const float scale = fp16 ? 1024.0f : 1.0f;
	uint64_t i;

	for (i = 0; i < self->m.l.n_params; i++) {
		float g = (ck_uniform(&self->rng) - 0.5f) * 2e-2f * scale;
		uint32_t b;

		memcpy(&b, &g, 4);
		self->grad[i] = fp16 ? ckpt_f32_to_f16(b) : ckpt_f32_to_bf16(b);
	}
}

static int begin(FIXTURE_DATA(step) *self, uint64_t t)
{
	step_params(self, t);
	return ck_begin(self->fd, t, self->gs, self->hp, N_GROUPS);
}

/*
 * Write the gradients of [lo, hi) (bytes of the window) in random sector
 * pieces of up to two chunks, in random order. After each piece, check the
 * PARAM window: chunks whose gradient is complete show the new values, the
 * others the committed ones. dst/src: slots of the model.
 */
static int write_pieces(struct __test_metadata *_metadata, FIXTURE_DATA(step) *self,
			uint64_t lo, uint64_t hi, int check_reads)
{
	const struct ck_model *m = &self->m;
	const uint32_t src = m->sb.committed_slot, dst = src ^ 1;
	uint64_t pieces[4096][2], n = 0, s, i;
	uint32_t covered[N_CHUNKS] = { 0 };
	uint16_t *rd = malloc(self->window);
	int ret = 0;

	for (s = lo / 512; s < hi / 512 && n < 4096;) {
		uint64_t k = 1 + ck_next(&self->rng) % (2 * self->cb / 512);

		if (k > hi / 512 - s)
			k = hi / 512 - s;
		pieces[n][0] = s;
		pieces[n][1] = k;
		n++;
		s += k;
	}
	for (i = n; i > 1; i--) {
		uint64_t j = ck_next(&self->rng) % i, a = pieces[i - 1][0], b = pieces[i - 1][1];

		pieces[i - 1][0] = pieces[j][0];
		pieces[i - 1][1] = pieces[j][1];
		pieces[j][0] = a;
		pieces[j][1] = b;
	}
	for (i = 0; i < n && !ret; i++) {
		uint64_t off = pieces[i][0] * 512, len = pieces[i][1] * 512, c;

		ret = ck_grad(self->fd, m, self->grad, off, len);
		if (ret) {
			TH_LOG("gradient write of %llu bytes at %llu: %s", (unsigned long long)len,
			       (unsigned long long)off, strerror(-ret));
			break;
		}
		for (s = pieces[i][0]; s < pieces[i][0] + pieces[i][1]; s++)
			covered[s / (self->cb / 512)]++;
		if (!check_reads || (i % 3 && i != n - 1))
			continue;
		ret = ck_params(self->fd, m, rd, 0, self->window);
		if (ret)
			break;
		for (c = 0; c < N_CHUNKS; c++) {
			int done = covered[c] == self->cb / 512;
			const uint16_t *want = m->plo[done ? dst : src] + c * m->cp;

			if (memcmp(rd + c * m->cp, want, self->cb)) {
				TH_LOG("PARAM read of chunk %llu (%s) shows the wrong slot",
				       (unsigned long long)c, done ? "complete" : "incomplete");
				ret = -1;
			}
		}
	}
	free(rd);
	return ret;
}

static int verify(struct __test_metadata *_metadata, FIXTURE_DATA(step) *self)
{
	char why[256];

	if (ck_model_verify(&self->m, why, sizeof(why))) {
		TH_LOG("backing device: %s", why);
		return -1;
	}
	return 0;
}

/* One full step t through the virtual device; the model follows. */
static int full_step(struct __test_metadata *_metadata, FIXTURE_DATA(step) *self, uint64_t t,
		     const char *blob)
{
	int ret;

	make_grads(self);
	ret = begin(self, t);
	if (ret) {
		TH_LOG("begin %llu: %s", (unsigned long long)t, strerror(-ret));
		return ret;
	}
	ck_model_step(&self->m, t, self->hp, self->gs, self->grad, NULL);
	ret = write_pieces(_metadata, self, 0, self->window, 1);
	if (ret)
		return ret;
	ret = ck_commit(self->fd, t, blob, blob ? (uint32_t)strlen(blob) : 0);
	if (ret) {
		TH_LOG("commit %llu: %s", (unsigned long long)t, strerror(-ret));
		return ret;
	}
	ck_model_commit(&self->m, t, blob, blob ? (uint32_t)strlen(blob) : 0);
	return verify(_metadata, self);
}

TEST_F(step, status_page)
{
	struct ckpt_status st;
	uint8_t *b = ck_alloc(2 * CKPT_BLOCK);

	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_IDLE, st.state);
	EXPECT_EQ(0, st.committed_step);
	EXPECT_EQ(0, st.committed_slot);
	EXPECT_EQ(N_CHUNKS, st.geo.n_chunks);
	EXPECT_EQ(SHIFT, st.geo.chunk_shift);
	EXPECT_EQ(N_GROUPS, st.geo.n_groups);
	EXPECT_EQ(variant->dtype, st.geo.dtype);
	EXPECT_EQ(CKPT_BLOCK, st.geo.manifest_bytes);
	/* a partial read of the control block is the same page */
	ASSERT_EQ(0, ck_pread(self->fd, b, CKPT_BLOCK, 0));
	ASSERT_EQ(0, ck_pread(self->fd, b + CKPT_BLOCK, 512, 1024));
	EXPECT_EQ(0, memcmp(b + 1024, b + CKPT_BLOCK, 512));
	/* GRAD reads are zeros; a read across control block and GRAD works */
	memset(b, 0xaa, 2 * CKPT_BLOCK);
	ASSERT_EQ(0, ck_pread(self->fd, b, 2 * CKPT_BLOCK, 0));
	EXPECT_EQ(CKPT_STATUS_MAGIC, *(uint32_t *)b);
	for (size_t i = CKPT_BLOCK; i < 2 * CKPT_BLOCK; i++)
		if (b[i]) {
			EXPECT_EQ(0, b[i]);
			break;
		}
	/* PARAM reads show the formatted p_lo */
	ASSERT_EQ(0, ck_params(self->fd, &self->m, b, 3 * self->cb + 512, 1024));
	EXPECT_EQ(0, memcmp(b, (uint8_t *)self->m.plo[0] + 3 * self->cb + 512, 1024));
	free(b);
}

TEST_F(step, steps_are_byte_identical)
{
	struct ckpt_status st;
	char blob[64];
	uint64_t t;

	for (t = 1; t <= 3; t++) {
		snprintf(blob, sizeof(blob), "step %llu loader 1234", (unsigned long long)t);
		ASSERT_EQ(0, full_step(_metadata, self, t, blob));
	}
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_IDLE, st.state);
	EXPECT_EQ(CKPT_RESULT_COMMITTED, st.last_result);
	EXPECT_EQ(3, st.committed_step);
	EXPECT_EQ(1, st.committed_slot);
	EXPECT_EQ(3, st.steps_committed);
	EXPECT_EQ(0, st.commands_rejected);
	EXPECT_EQ(3 * self->window, st.grad_bytes);
	EXPECT_LT(0, st.param_bytes);
	EXPECT_EQ(strlen(blob), st.blob_len);
	EXPECT_EQ(0, memcmp(st.blob, blob, st.blob_len));
}

static int msg(char *out, size_t n, const char *fmt, ...)
{
	char m[6000];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(m, sizeof(m), fmt, ap);
	va_end(ap);
	return ck_sh(out, n, "dmsetup message %s 0 %s 2>&1", CK_NAME, m);
}

static void group_token(char *out, size_t n, const struct ckpt_hparams *h)
{
	snprintf(out, n, "%08x,%08x,%08x,%08x,%08x,%08x,%08x,%08x,%08x,%08x,%x", h->lr, h->beta1,
		 h->beta2, h->eps, h->weight_decay, h->one_minus_beta1, h->one_minus_beta2,
		 h->step_size, h->bc2_sqrt, h->decay, h->flags);
}

TEST_F(step, messages)
{
	char g0[128], g1[128], out[4096];
	struct ckpt_status st;

	make_grads(self);
	step_params(self, 1);
	group_token(g0, sizeof(g0), &self->hp[0]);
	group_token(g1, sizeof(g1), &self->hp[1]);
	/* syntax errors: refused, not protocol rejections */
	EXPECT_NE(0, msg(out, sizeof(out), "begin 1"));
	EXPECT_NE(0, msg(out, sizeof(out), "begin 1 %08x %s,1,2", self->gs, g0));
	EXPECT_NE(0, msg(out, sizeof(out), "begin x %08x %s %s", self->gs, g0, g1));
	EXPECT_NE(0, msg(out, sizeof(out), "commit"));
	EXPECT_NE(0, msg(out, sizeof(out), "commit 1 abc"));
	EXPECT_NE(0, msg(out, sizeof(out), "frobnicate"));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(0, st.commands_rejected);
	EXPECT_EQ(CKPT_STATE_IDLE, st.state);
	/* protocol rejections: recorded */
	EXPECT_NE(0, msg(out, sizeof(out), "begin 2 %08x %s %s", self->gs, g0, g1));
	EXPECT_NE(0, msg(out, sizeof(out), "begin 1 %08x %s", self->gs, g0));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(2, st.commands_rejected);
	EXPECT_EQ(CKPT_E_GROUPS, st.last_error);

	ASSERT_EQ(0, msg(out, sizeof(out), "begin 1 %08x %s %s", self->gs, g0, g1));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_OPEN, st.state);
	EXPECT_EQ(1, st.open_step);
	ck_model_step(&self->m, 1, self->hp, self->gs, self->grad, NULL);
	ASSERT_EQ(0, write_pieces(_metadata, self, 0, self->window, 0));
	ASSERT_EQ(0, msg(out, sizeof(out), "stats"));
	EXPECT_NE(NULL, strstr(out, "state open\n"));
	EXPECT_NE(NULL, strstr(out, "chunks_done 8\n"));
	ASSERT_EQ(0, msg(out, sizeof(out), "commit 1 626c6f62"));
	EXPECT_NE(NULL, strstr(out, "committed 1"));
	ck_model_commit(&self->m, 1, "blob", 4);
	ASSERT_EQ(0, verify(_metadata, self));
	ASSERT_EQ(0, msg(out, sizeof(out), "stats"));
	EXPECT_NE(NULL, strstr(out, "state idle\ncommitted_step 1\ncommitted_slot 1\nsequence 2\n"));
	EXPECT_NE(NULL, strstr(out, "blob_len 4\n"));

	/* abort through a message, with and without the step */
	step_params(self, 2);
	group_token(g0, sizeof(g0), &self->hp[0]);
	group_token(g1, sizeof(g1), &self->hp[1]);
	ASSERT_EQ(0, msg(out, sizeof(out), "begin 2 %08x %s %s", self->gs, g0, g1));
	EXPECT_NE(0, msg(out, sizeof(out), "abort 3"));
	ASSERT_EQ(0, msg(out, sizeof(out), "abort 2"));
	ASSERT_EQ(0, msg(out, sizeof(out), "begin 2 %08x %s %s", self->gs, g0, g1));
	ASSERT_EQ(0, msg(out, sizeof(out), "abort"));
	ASSERT_EQ(0, ck_sh(out, sizeof(out), "dmsetup status %s", CK_NAME));
	/* state committed open chunks overflow result error ioerr commits skips aborts rejects */
	EXPECT_NE(NULL, strstr(out, " ckpt idle 1 0 0/8 0 aborted 0 0 1 0 2 3 "));
	ASSERT_EQ(0, verify(_metadata, self));
}

/*
 * The rollback message: step 2 committed, then step 1 again with its blob;
 * the backing device is what the model says (the superblock after the
 * commit of step 2, committing step 1 in its slot, whose records carry the
 * new sequence): byte for byte what the engine's rollback writes. Refused
 * at step 0, with a step open, a second time, and after a step wrote over
 * the previous slot; each refusal changes nothing.
 */
TEST_F(step, rollback_message)
{
	uint16_t *rd = malloc(self->window);
	char out[4096];
	struct ckpt_status st;

	EXPECT_NE(0, msg(out, sizeof(out), "rollback"));	/* step 0 */
	EXPECT_NE(0, msg(out, sizeof(out), "rollback now"));	/* syntax */
	ASSERT_EQ(0, full_step(_metadata, self, 1, "one"));
	ASSERT_EQ(0, full_step(_metadata, self, 2, "two"));
	ASSERT_EQ(0, begin(self, 3));
	EXPECT_EQ(-EINVAL, ck_dm_message(CK_NAME, "rollback"));	/* a step is open */
	ASSERT_EQ(0, msg(out, sizeof(out), "abort"));
	ASSERT_EQ(0, verify(_metadata, self));

	ASSERT_EQ(0, msg(out, sizeof(out), "rollback"));
	EXPECT_NE(NULL, strstr(out, "rolled_back 1"));
	ck_model_rollback(&self->m, "one");
	ASSERT_EQ(0, verify(_metadata, self));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(1, st.committed_step);
	EXPECT_EQ(CKPT_STATE_IDLE, st.state);
	EXPECT_EQ(3, st.blob_len);
	EXPECT_EQ(0, memcmp(st.blob, "one", 3));
	/* PARAM reads give step 1's params */
	ASSERT_NE(NULL, rd);
	ASSERT_EQ(0, ck_params(self->fd, &self->m, rd, 0, self->window));
	EXPECT_EQ(0, memcmp(rd, self->m.plo[self->m.sb.committed_slot], self->window));
	/* never two steps */
	EXPECT_EQ(-EINVAL, ck_dm_message(CK_NAME, "rollback"));
	ASSERT_EQ(0, verify(_metadata, self));

	/* the next step is step 2 again, built on step 1 */
	ASSERT_EQ(0, full_step(_metadata, self, 2, "two again"));
	/* a step that wrote over the previous slot, aborted: nothing to go back to */
	make_grads(self);
	ASSERT_EQ(0, begin(self, 3));
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 0, self->cb));
	ASSERT_EQ(0, msg(out, sizeof(out), "abort"));
	EXPECT_EQ(-EINVAL, ck_dm_message(CK_NAME, "rollback"));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(2, st.committed_step);
	free(rd);
}

/*
 * The ROLLBACK command through the control block, the trainer's channel:
 * the rule and the bytes of the message (ck_model_rollback). A refusal (step
 * 0, a step other than the committed one, a step open, a second time, the
 * previous slot overwritten) fails the write with EIO, says why on the
 * status page and changes nothing on the backing device; a rollback keeps
 * the counters.
 */
static void rollback_refused(struct __test_metadata *_metadata, FIXTURE_DATA(step) *self,
			     uint64_t t, uint32_t err)
{
	struct ckpt_status st;
	uint64_t rejected;

	ASSERT_EQ(0, ck_status(self->fd, &st));
	rejected = st.commands_rejected;
	EXPECT_EQ(-EIO, ck_rollback(self->fd, t));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(err, st.last_error);
	EXPECT_EQ(CKPT_RESULT_REJECTED, st.last_result);
	EXPECT_EQ(rejected + 1, st.commands_rejected);
	EXPECT_EQ(0, verify(_metadata, self));
}

TEST_F(step, rollback_command)
{
	uint16_t *rd = malloc(self->window);
	char out[4096];
	struct ckpt_status st;

	rollback_refused(_metadata, self, 0, CKPT_E_ROLLBACK);	/* step 0 */
	ASSERT_EQ(0, full_step(_metadata, self, 1, "one"));
	ASSERT_EQ(0, full_step(_metadata, self, 2, "two"));
	rollback_refused(_metadata, self, 1, CKPT_E_STEP);
	rollback_refused(_metadata, self, 3, CKPT_E_STEP);
	ASSERT_EQ(0, begin(self, 3));
	rollback_refused(_metadata, self, 2, CKPT_E_STATE);
	ASSERT_EQ(0, msg(out, sizeof(out), "abort"));

	ASSERT_EQ(0, ck_rollback(self->fd, 2));
	ck_model_rollback(&self->m, "one");
	ASSERT_EQ(0, verify(_metadata, self));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(1, st.committed_step);
	EXPECT_EQ(CKPT_STATE_IDLE, st.state);
	EXPECT_EQ(CKPT_RESULT_NONE, st.last_result);
	EXPECT_EQ(2, st.steps_committed);	/* counters kept */
	EXPECT_EQ(1, st.steps_aborted);
	EXPECT_EQ(4, st.commands_rejected);
	EXPECT_EQ(3, st.blob_len);
	EXPECT_EQ(0, memcmp(st.blob, "one", 3));
	ASSERT_NE(NULL, rd);
	ASSERT_EQ(0, ck_params(self->fd, &self->m, rd, 0, self->window));
	EXPECT_EQ(0, memcmp(rd, self->m.plo[self->m.sb.committed_slot], self->window));
	rollback_refused(_metadata, self, 0, CKPT_E_ROLLBACK);	/* never two steps */
	rollback_refused(_metadata, self, 1, CKPT_E_ROLLBACK);

	ASSERT_EQ(0, full_step(_metadata, self, 2, "two again"));
	make_grads(self);
	ASSERT_EQ(0, begin(self, 3));
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 0, self->cb));
	ASSERT_EQ(0, msg(out, sizeof(out), "abort"));
	/* the aborted step wrote the other slot: the model no longer knows it */
	memset(self->m.valid[self->m.sb.committed_slot ^ 1], 0, sizeof(self->m.valid[0]));
	rollback_refused(_metadata, self, 2, CKPT_E_ROLLBACK);	/* overwritten */
	/* the message is the same rollback: refused alike */
	EXPECT_EQ(-EINVAL, ck_dm_message(CK_NAME, "rollback 2"));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_E_ROLLBACK, st.last_error);
	EXPECT_EQ(2, st.committed_step);
	free(rd);
}

TEST_F(step, bad_commands_change_nothing)
{
	struct ckpt_status st0, st;
	uint8_t *b = ck_alloc(2 * CKPT_BLOCK);
	struct ckpt_cmd *cmd = calloc(1, sizeof(*cmd));
	int len;

#define EXPECT_REFUSED(call, err) do {						\
		EXPECT_EQ(-EIO, (call));					\
		ASSERT_EQ(0, ck_status(self->fd, &st));				\
		EXPECT_EQ(CKPT_RESULT_REJECTED, st.last_result);		\
		EXPECT_EQ((err), st.last_error);				\
	} while (0)

	make_grads(self);
	/* a gradient with no open step */
	EXPECT_REFUSED(ck_grad(self->fd, &self->m, self->grad, 0, self->cb), CKPT_E_STATE);
	/* COMMIT and ABORT with no open step */
	EXPECT_REFUSED(ck_commit(self->fd, 1, NULL, 0), CKPT_E_STATE);
	EXPECT_REFUSED(ck_abort(self->fd, 0), CKPT_E_STATE);
	/* BEGIN of the wrong step */
	step_params(self, 2);
	EXPECT_REFUSED(ck_begin(self->fd, 2, self->gs, self->hp, N_GROUPS), CKPT_E_STEP);
	EXPECT_REFUSED(ck_begin(self->fd, 0, self->gs, self->hp, N_GROUPS), CKPT_E_STEP);
	/* bad hyperparameters and grad_scale */
	step_params(self, 1);
	self->hp[1].eps = 0x7fc00000u;
	EXPECT_REFUSED(ck_begin(self->fd, 1, self->gs, self->hp, N_GROUPS), CKPT_E_HPARAM);
	step_params(self, 1);
	EXPECT_REFUSED(ck_begin(self->fd, 1, 0, self->hp, N_GROUPS), CKPT_E_HPARAM);
	/* a command with a wrong checksum, magic, version, length, opcode */
	memset(cmd, 0, sizeof(*cmd));
	cmd->opcode = CKPT_OP_BEGIN;
	cmd->step = 1;
	cmd->grad_scale = self->gs;
	cmd->n_groups = N_GROUPS;
	memcpy(cmd->groups, self->hp, sizeof(self->hp));
	len = ckpt_cmd_encode(cmd, b);
	ASSERT_LT(0, len);
	b[40] ^= 1;
	EXPECT_REFUSED(ck_pwrite(self->fd, b, 512, 0), CKPT_E_CRC);
	b[40] ^= 1;
	b[0] ^= 1;
	EXPECT_REFUSED(ck_pwrite(self->fd, b, 512, 0), CKPT_E_MAGIC);
	b[0] ^= 1;
	memset(b + 512, 0, 512);
	EXPECT_REFUSED(ck_pwrite(self->fd, b, 512, 512), CKPT_E_RANGE);
	EXPECT_REFUSED(ck_pwrite(self->fd, b, 2 * CKPT_BLOCK, 0), CKPT_E_RANGE);
	cmd->opcode = 9;
	len = ckpt_cmd_encode(cmd, b);
	EXPECT_GT(0, len);
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_IDLE, st.state);
	EXPECT_EQ(0, st.committed_step);
	EXPECT_EQ(11, st.commands_rejected);

	/* now open step 1 and refuse what is wrong inside it */
	ASSERT_EQ(0, begin(self, 1));
	EXPECT_REFUSED(begin(self, 1), CKPT_E_STATE);
	ck_model_step(&self->m, 1, self->hp, self->gs, self->grad, NULL);
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 0, self->cb));	/* chunk 0 */
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, self->cb + 512, 1024));
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 3 * self->cb, self->cb));
	ASSERT_EQ(0, ck_status(self->fd, &st0));
	/* written twice: a whole chunk, a sector of a staged chunk, a whole over a staged one */
	EXPECT_REFUSED(ck_grad(self->fd, &self->m, self->grad, 0, self->cb), CKPT_E_TWICE);
	EXPECT_REFUSED(ck_grad(self->fd, &self->m, self->grad, 1024, 512), CKPT_E_TWICE);
	EXPECT_REFUSED(ck_grad(self->fd, &self->m, self->grad, self->cb + 1024, 1024),
		       CKPT_E_TWICE);
	EXPECT_REFUSED(ck_grad(self->fd, &self->m, self->grad, self->cb, self->cb), CKPT_E_TWICE);
	/* a write refused as a whole although its first chunk would be fine */
	EXPECT_REFUSED(ck_grad(self->fd, &self->m, self->grad, 2 * self->cb, 2 * self->cb),
		       CKPT_E_TWICE);
	/* PARAM writes, and GRAD writes running into PARAM */
	EXPECT_REFUSED(ck_write_at(self->fd, b, 512, self->m.l.param_off), CKPT_E_READONLY);
	EXPECT_REFUSED(ck_write_at(self->fd, b, 1024, self->m.l.param_off - 512), CKPT_E_RANGE);
	/* COMMIT with chunks missing, COMMIT of another step */
	EXPECT_REFUSED(ck_commit(self->fd, 1, NULL, 0), CKPT_E_INCOMPLETE);
	EXPECT_REFUSED(ck_commit(self->fd, 2, NULL, 0), CKPT_E_STEP);
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_OPEN, st.state);
	EXPECT_EQ(st0.chunks_done, st.chunks_done);
	EXPECT_EQ(2, st.chunks_done);
	EXPECT_EQ(st0.grad_bytes, st.grad_bytes);

	/* the rest of the step, then a good commit: exactly the reference */
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, self->cb, 512));
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, self->cb + 1536,
			     2 * self->cb - 1536));
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 4 * self->cb,
			     self->window - 4 * self->cb));
	ASSERT_EQ(0, ck_commit(self->fd, 1, NULL, 0));
	ck_model_commit(&self->m, 1, NULL, 0);
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_RESULT_COMMITTED, st.last_result);
	EXPECT_EQ(0, st.last_error);
	EXPECT_EQ(1, st.committed_step);
	EXPECT_EQ(0, verify(_metadata, self));
	free(cmd);
	free(b);
#undef EXPECT_REFUSED
}

/*
 * Per-bio atomicity: one gradient write (one O_DIRECT pwrite, one bio) with
 * chunk 2 whole and the first 1 KiB of chunk 3, whose second sector is
 * already staged, is refused as a whole. Nothing of it stays: chunk 2 is
 * not updated (its PARAM read still shows the committed values, and it can
 * then be written alone), and the new first sector of chunk 3 was not
 * staged (it can be written again). The refused bio carries other
 * gradients than the reference's, so any of it kept would show in the
 * committed image.
 */
TEST_F(step, refused_bio_changes_nothing)
{
	const uint64_t cb = self->cb;
	const uint32_t src = self->m.sb.committed_slot;
	uint16_t *bogus = ck_alloc(cb + 1024), *rd = ck_alloc(cb);
	struct ckpt_status st0, st;
	size_t i;

	ASSERT_NE(NULL, bogus);
	ASSERT_NE(NULL, rd);
	for (i = 0; i < (cb + 1024) / 2; i++)
		bogus[i] = variant->dtype == CKPT_DTYPE_FP16 ? 0x3c00 : 0x3f80;	/* 1.0 */
	make_grads(self);
	ASSERT_EQ(0, begin(self, 1));
	ck_model_step(&self->m, 1, self->hp, self->gs, self->grad, NULL);
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 3 * cb + 512, 512));
	ASSERT_EQ(0, ck_status(self->fd, &st0));

	EXPECT_EQ(-EIO, ck_pwrite(self->fd, bogus, cb + 1024, self->m.l.grad_off + 2 * cb));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_OPEN, st.state);
	EXPECT_EQ(CKPT_RESULT_REJECTED, st.last_result);
	EXPECT_EQ(CKPT_E_TWICE, st.last_error);
	EXPECT_EQ(st0.commands_rejected + 1, st.commands_rejected);
	EXPECT_EQ(0, st.chunks_done);
	EXPECT_EQ(st0.grad_bytes, st.grad_bytes);
	EXPECT_EQ(0, st.io_errors);
	ASSERT_EQ(0, ck_params(self->fd, &self->m, rd, 2 * cb, cb));
	EXPECT_EQ(0, memcmp(rd, self->m.plo[src] + 2 * self->m.cp, cb));

	/* chunk 2 alone, the sectors of chunk 3 the refused bio had, the rest */
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 2 * cb, cb));
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 3 * cb, 512));
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 3 * cb + 1024, cb - 1024));
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 0, 2 * cb));
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 4 * cb, self->window - 4 * cb));
	ASSERT_EQ(0, ck_commit(self->fd, 1, NULL, 0));
	ck_model_commit(&self->m, 1, NULL, 0);
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_RESULT_COMMITTED, st.last_result);
	EXPECT_EQ(1, st.committed_step);
	EXPECT_EQ(self->window, st.grad_bytes);
	ASSERT_EQ(0, ck_params(self->fd, &self->m, rd, 2 * cb, cb));
	EXPECT_EQ(0, memcmp(rd, self->m.plo[src ^ 1] + 2 * self->m.cp, cb));
	EXPECT_EQ(0, verify(_metadata, self));
	free(bogus);
	free(rd);
}

/*
 * The IMAGE window: the backing image read through the target, byte for
 * byte as on the backing device, at every step (what a client served over
 * NVMe-oF reads the manifest, counts and state from); a write anywhere in
 * it is refused (E_READONLY on the status page) and changes nothing.
 */
TEST_F(step, image_window_reads_the_backing_image)
{
	const uint64_t n = self->m.l.dev_bytes, at = self->m.l.image_off;
	uint8_t *via = malloc(n), *direct = malloc(n), *bogus = malloc(8192);
	int bfd = open(ck_dev(), O_RDONLY | O_DIRECT);
	struct ckpt_status st;
	uint64_t t;

	ASSERT_NE(NULL, via);
	ASSERT_NE(NULL, direct);
	ASSERT_NE(NULL, bogus);
	ASSERT_LE(0, bfd);
	EXPECT_EQ(self->m.l.virt_bytes, at + n);
	EXPECT_EQ(self->m.l.virt_bytes, ck_dev_bytes("/dev/mapper/" CK_NAME));
	for (t = 1; t <= 2; t++) {
		ASSERT_EQ(0, full_step(_metadata, self, t, "image window"));
		ASSERT_EQ(0, ck_read_at(self->fd, via, n, at));
		ASSERT_EQ(0, ck_read_at(bfd, direct, n, 0));
		EXPECT_EQ(0, memcmp(via, direct, n));
	}
	/* unaligned and across its start: the PARAM window's tail, then the image */
	ASSERT_EQ(0, ck_read_at(self->fd, via, 8192, at - 4096));
	EXPECT_EQ(0, memcmp(via + 4096, direct, 4096));

	memset(bogus, 0xa5, 8192);
	EXPECT_EQ(-EIO, ck_write_at(self->fd, bogus, 4096, at));
	EXPECT_EQ(-EIO, ck_write_at(self->fd, bogus, 512, at + n - 512));
	EXPECT_EQ(-EIO, ck_write_at(self->fd, bogus, 8192, at - 4096));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_RESULT_REJECTED, st.last_result);
	EXPECT_EQ(CKPT_E_READONLY, st.last_error);
	EXPECT_EQ(3, st.commands_rejected);
	ASSERT_EQ(0, ck_read_at(bfd, via, n, 0));
	EXPECT_EQ(0, memcmp(via, direct, n));
	EXPECT_EQ(0, verify(_metadata, self));
	close(bfd);
	free(via);
	free(direct);
	free(bogus);
}

/* A gradient that is not finite after scaling: the step is skipped, but every
 * finite chunk was written to the other slot (as the engine does). */
TEST_F(step, overflow_skips_the_step)
{
	const int fp16 = variant->dtype == CKPT_DTYPE_FP16;
	uint16_t *rd = malloc(self->window);
	struct ckpt_status st;
	int overflow;

	ASSERT_EQ(0, full_step(_metadata, self, 1, "one"));
	make_grads(self);
	self->grad[5 * self->m.cp + 17] = fp16 ? 0x7c00 : 0x7f80;	/* +inf */
	ASSERT_EQ(0, begin(self, 2));
	overflow = ck_model_step(&self->m, 2, self->hp, self->gs, self->grad, NULL);
	ASSERT_EQ(1, overflow);
	ASSERT_EQ(0, write_pieces(_metadata, self, 0, self->window, 0));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(1, st.overflow);
	EXPECT_EQ(N_CHUNKS, st.chunks_done);
	ASSERT_EQ(0, ck_commit(self->fd, 2, "two", 3));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_RESULT_OVERFLOW, st.last_result);
	EXPECT_EQ(CKPT_STATE_IDLE, st.state);
	EXPECT_EQ(1, st.committed_step);
	EXPECT_EQ(1, st.steps_skipped);
	EXPECT_EQ(3, st.blob_len);	/* the blob of step 1 */
	/* nothing committed; finite chunks of step 2 are in slot 0, chunk 5 is not */
	EXPECT_EQ(0, verify(_metadata, self));
	/* PARAM reads are the committed values again */
	ASSERT_EQ(0, ck_params(self->fd, &self->m, rd, 0, self->window));
	EXPECT_EQ(0, memcmp(rd, self->m.plo[self->m.sb.committed_slot], self->window));
	free(rd);
	/* step 2 again, finite this time */
	ASSERT_EQ(0, full_step(_metadata, self, 2, "two"));
}

TEST_F(step, abort_then_retry)
{
	struct ckpt_status st;
	int which[N_CHUNKS] = { 0 };

	make_grads(self);
	ASSERT_EQ(0, begin(self, 1));
	/* chunks 0..2 whole, plus half of chunk 3 staged */
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 0, 3 * self->cb + self->cb / 2));
	which[0] = which[1] = which[2] = 1;
	ck_model_step(&self->m, 1, self->hp, self->gs, self->grad, which);
	ASSERT_EQ(0, ck_abort(self->fd, 1));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_RESULT_ABORTED, st.last_result);
	EXPECT_EQ(1, st.steps_aborted);
	EXPECT_EQ(0, st.committed_step);
	/* the aborted step's completed chunks stay in slot 1, uncommitted */
	EXPECT_EQ(0, verify(_metadata, self));
	/* the staged half of chunk 3 was dropped: writing it again is fine */
	ASSERT_EQ(0, full_step(_metadata, self, 1, NULL));
}

/* Many writes in flight at once (one-sector pieces from 8 threads). */
struct conc {
	int fd;
	const struct ck_model *m;
	const uint16_t *grad;
	uint64_t *order;
	uint64_t n;
	int next;		/* atomic */
	int errors;		/* atomic */
};

static void *conc_writer(void *arg)
{
	struct conc *k = arg;
	int i;

	while ((i = __atomic_fetch_add(&k->next, 1, __ATOMIC_RELAXED)) < (int)k->n)
		if (ck_grad(k->fd, k->m, k->grad, k->order[i] * 512, 512))
			__atomic_fetch_add(&k->errors, 1, __ATOMIC_RELAXED);
	return NULL;
}

TEST_F(step, concurrent_writes)
{
	struct conc k = { .fd = self->fd, .m = &self->m, .grad = self->grad };
	pthread_t th[8];
	uint64_t i, t;

	k.n = self->window / 512;
	k.order = calloc(k.n, sizeof(*k.order));
	for (t = 1; t <= 2; t++) {
		make_grads(self);
		ASSERT_EQ(0, begin(self, t));
		ck_model_step(&self->m, t, self->hp, self->gs, self->grad, NULL);
		for (i = 0; i < k.n; i++)
			k.order[i] = i;
		for (i = k.n; i > 1; i--) {
			uint64_t j = ck_next(&self->rng) % i, x = k.order[i - 1];

			k.order[i - 1] = k.order[j];
			k.order[j] = x;
		}
		k.next = 0;
		for (i = 0; i < 8; i++)
			ASSERT_EQ(0, pthread_create(&th[i], NULL, conc_writer, &k));
		for (i = 0; i < 8; i++)
			pthread_join(th[i], NULL);
		ASSERT_EQ(0, k.errors);
		ASSERT_EQ(0, ck_commit(self->fd, t, NULL, 0));
		ck_model_commit(&self->m, t, NULL, 0);
		ASSERT_EQ(0, verify(_metadata, self));
	}
	free(k.order);
}

TEST_F(step, suspend_resume_keeps_the_open_step)
{
	struct ckpt_status st;
	char out[256];

	make_grads(self);
	ASSERT_EQ(0, begin(self, 1));
	ck_model_step(&self->m, 1, self->hp, self->gs, self->grad, NULL);
	ASSERT_EQ(0, write_pieces(_metadata, self, 0, self->window / 2 + 1024, 0));
	ASSERT_EQ(0, ck_sh(out, sizeof(out), "dmsetup suspend --noudevsync %s 2>&1", CK_NAME));
	ASSERT_EQ(0, ck_sh(out, sizeof(out), "dmsetup resume --noudevsync %s 2>&1", CK_NAME));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_OPEN, st.state);
	EXPECT_EQ(N_CHUNKS / 2, st.chunks_done);
	ASSERT_EQ(0, write_pieces(_metadata, self, self->window / 2 + 1024, self->window, 0));
	ASSERT_EQ(0, ck_commit(self->fd, 1, "s", 1));
	ck_model_commit(&self->m, 1, "s", 1);
	EXPECT_EQ(0, verify(_metadata, self));
}

TEST_F(step, reload_starts_from_the_committed_state)
{
	struct ckpt_status st;
	char out[512], table[256];

	ASSERT_EQ(0, full_step(_metadata, self, 1, "one"));
	make_grads(self);
	ASSERT_EQ(0, begin(self, 2));
	ASSERT_EQ(0, write_pieces(_metadata, self, 0, self->window / 2, 0));
	snprintf(table, sizeof(table), "0 %llu ckpt %s 2 queue_depth 2",
		 (unsigned long long)ck_sectors(&self->m), ck_dev());
	ASSERT_EQ(0, ck_sh(out, sizeof(out), "dmsetup reload --noudevsync %s --table '%s' 2>&1", CK_NAME, table));
	ASSERT_EQ(0, ck_sh(out, sizeof(out), "dmsetup resume --noudevsync %s 2>&1", CK_NAME));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_IDLE, st.state);
	EXPECT_EQ(1, st.committed_step);
	EXPECT_EQ(3, st.blob_len);
	EXPECT_EQ(0, st.steps_committed);	/* a new instance */
	ASSERT_EQ(0, full_step(_metadata, self, 2, "two"));
}

TEST_F(step, restore_after_remove)
{
	struct ckpt_status st;
	uint16_t *rd = malloc(self->window);

	ASSERT_EQ(0, full_step(_metadata, self, 1, "one"));
	ASSERT_EQ(0, full_step(_metadata, self, 2, "two"));
	/* an open step with some chunks applied is lost with the device */
	make_grads(self);
	ASSERT_EQ(0, begin(self, 3));
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 0, 2 * self->cb));
	close(self->fd);
	self->fd = -1;
	ck_remove(CK_NAME);
	ASSERT_EQ(0, create_default(&self->m, NULL));
	self->fd = ck_open_dm(CK_NAME);
	ASSERT_LE(0, self->fd);
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_IDLE, st.state);
	EXPECT_EQ(2, st.committed_step);
	EXPECT_EQ(0, st.committed_slot);
	EXPECT_EQ(3, st.blob_len);
	EXPECT_EQ(0, memcmp(st.blob, "two", 3));
	ASSERT_EQ(0, ck_params(self->fd, &self->m, rd, 0, self->window));
	EXPECT_EQ(0, memcmp(rd, self->m.plo[0], self->window));
	ASSERT_EQ(0, full_step(_metadata, self, 3, "three"));
	free(rd);
}

TEST_F(step, staging_is_bounded)
{
	struct ckpt_status st;

	close(self->fd);
	ck_remove(CK_NAME);
	/* 1 KiB of staging: the minimum of 2 partial chunks */
	ASSERT_EQ(0, create_default(&self->m, "4 staging_kb 1 queue_depth 1"));
	self->fd = ck_open_dm(CK_NAME);
	ASSERT_LE(0, self->fd);
	make_grads(self);
	ASSERT_EQ(0, begin(self, 1));
	ck_model_step(&self->m, 1, self->hp, self->gs, self->grad, NULL);
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 0, 512));
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, self->cb, 512));
	EXPECT_EQ(-EIO, ck_grad(self->fd, &self->m, self->grad, 2 * self->cb, 512));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_E_NOSPC, st.last_error);
	/* completing a staged chunk frees its stage */
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 512, self->cb - 512));
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 2 * self->cb, 512));
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, self->cb + 512, self->cb - 512));
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 2 * self->cb + 512,
			     self->window - 2 * self->cb - 512));
	ASSERT_EQ(0, ck_commit(self->fd, 1, NULL, 0));
	ck_model_commit(&self->m, 1, NULL, 0);
	EXPECT_EQ(0, verify(_metadata, self));
}

/*
 * The target over ckpt_kt_bk, a linear view of the test device that is
 * created (exists 0) or, from an error table, restored. 0, or -1.
 */
static int on_linear_view(FIXTURE_DATA(step) *self, uint64_t sectors, int exists)
{
	char table[256];
	int ret;

	snprintf(table, sizeof(table), "0 %llu linear %s 0", (unsigned long long)sectors, ck_dev());
	ret = exists ? ck_reload("ckpt_kt_bk", table) : ck_create("ckpt_kt_bk", table);
	if (!ret)
		ret = ck_create_ckpt(&self->m, CK_NAME, "/dev/mapper/ckpt_kt_bk", NULL);
	if (ret)
		return -1;
	self->fd = ck_open_dm(CK_NAME);
	return self->fd < 0 ? -1 : 0;
}

/* A backing I/O error fails the target; the committed state is untouched. */
TEST_F(step, backing_error_fails_the_target)
{
	struct ckpt_status st;
	char out[512], table[256];
	int which[N_CHUNKS] = { 0 };
	uint64_t dev_sectors = ck_dev_bytes(ck_dev()) / 512;

	close(self->fd);
	ck_remove(CK_NAME);
	ASSERT_EQ(0, on_linear_view(self, dev_sectors, 0));
	ASSERT_EQ(0, full_step(_metadata, self, 1, "one"));

	make_grads(self);
	ASSERT_EQ(0, begin(self, 2));
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 0, self->cb));
	which[0] = 1;	/* chunk 0 of step 2 reaches slot 0 */
	ck_model_step(&self->m, 2, self->hp, self->gs, self->grad, which);
	/* the backing device dies */
	snprintf(table, sizeof(table), "0 %llu error", (unsigned long long)dev_sectors);
	ASSERT_EQ(0, ck_reload("ckpt_kt_bk", table));
	EXPECT_EQ(-EIO, ck_grad(self->fd, &self->m, self->grad, self->cb, self->cb));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_FAILED, st.state);
	EXPECT_EQ(EIO, st.first_io_error);
	EXPECT_LE(1, st.io_errors);
	EXPECT_EQ(1, st.committed_step);
	EXPECT_EQ(-EIO, ck_commit(self->fd, 2, NULL, 0));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_E_FAILED, st.last_error);
	EXPECT_EQ(-EIO, ck_abort(self->fd, 2));
	EXPECT_EQ(-EIO, ck_grad(self->fd, &self->m, self->grad, 2 * self->cb, self->cb));
	ASSERT_EQ(0, ck_sh(out, sizeof(out), "dmsetup status %s", CK_NAME));
	EXPECT_NE(NULL, strstr(out, " ckpt failed 1 0 "));

	/* the device comes back: a new target starts from step 1, intact */
	close(self->fd);
	self->fd = -1;
	ck_remove(CK_NAME);
	ASSERT_EQ(0, on_linear_view(self, dev_sectors, 1));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_IDLE, st.state);
	EXPECT_EQ(1, st.committed_step);
	EXPECT_EQ(0, verify(_metadata, self));
	ASSERT_EQ(0, full_step(_metadata, self, 2, "two"));
}

/*
 * Bit rot in committed state must not become new committed state with a fresh
 * checksum: the step checks the data crc of the record it reads, fails the
 * write and the target, and the committed state stays as it was (damage
 * included, for ckptctl verify to find).
 */
TEST_F(step, flipped_data_bit_fails_the_step)
{
	const uint32_t slot = 1;	/* committed after step 1 */
	struct ckpt_status st;

	ASSERT_EQ(0, full_step(_metadata, self, 1, "one"));
	ASSERT_EQ(slot, self->m.sb.committed_slot);
	/* an exponent bit of p[0] of chunk 0, on the device and in the model */
	ASSERT_EQ(0, ck_flip_record_data(&self->m, slot, 0, 2, 0x40));
	((uint8_t *)self->m.state[slot])[2] ^= 0x40;

	ck_kmsg_clear();
	make_grads(self);
	ASSERT_EQ(0, begin(self, 2));
	EXPECT_EQ(-EIO, ck_grad(self->fd, &self->m, self->grad, 0, self->cb));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_FAILED, st.state);
	EXPECT_EQ(1, st.committed_step);
	EXPECT_EQ(1, ck_kmsg_has("chunk 0 slot 1: data checksum mismatch"));
	EXPECT_EQ(-EIO, ck_commit(self->fd, 2, NULL, 0));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_E_FAILED, st.last_error);
	/* nothing written: the model (with the flipped bit) is what is on disk */
	EXPECT_EQ(0, verify(_metadata, self));
}

/*
 * What torch.optim.AdamW refuses (and derived values no valid input gives)
 * is refused at BEGIN: E_HPARAM, nothing changes.
 */
TEST_F(step, begin_refuses_out_of_range_hparams)
{
	struct ckpt_status st;
	const struct {
		size_t off;
		uint32_t bits;
	} bad[] = {
		{ offsetof(struct ckpt_hparams, lr), 0xba83126fu },		/* -1e-3 */
		{ offsetof(struct ckpt_hparams, beta1), 0x3fc00000u },		/* 1.5 */
		{ offsetof(struct ckpt_hparams, beta2), 0xbdcccccdu },		/* -0.1 */
		{ offsetof(struct ckpt_hparams, eps), 0xb22bcc77u },		/* -1e-8 */
		{ offsetof(struct ckpt_hparams, weight_decay), 0xbc23d70au },	/* -0.01 */
		{ offsetof(struct ckpt_hparams, one_minus_beta1), 0 },
		{ offsetof(struct ckpt_hparams, one_minus_beta2), 0x40000000u },	/* 2 */
		{ offsetof(struct ckpt_hparams, step_size), 0xbc23d70au },
		{ offsetof(struct ckpt_hparams, bc2_sqrt), 0 },
	};
	size_t i;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		step_params(self, 1);
		memcpy((uint8_t *)&self->hp[1] + bad[i].off, &bad[i].bits, 4);
		EXPECT_EQ(-EIO, ck_begin(self->fd, 1, self->gs, self->hp, N_GROUPS));
		ASSERT_EQ(0, ck_status(self->fd, &st));
		EXPECT_EQ(CKPT_RESULT_REJECTED, st.last_result);
		EXPECT_EQ(CKPT_E_HPARAM, st.last_error);
		EXPECT_EQ(CKPT_STATE_IDLE, st.state);
		EXPECT_EQ(0, st.committed_step);
		EXPECT_EQ(i + 1, st.commands_rejected);
	}
	EXPECT_EQ(0, verify(_metadata, self));
	ASSERT_EQ(0, full_step(_metadata, self, 1, "one"));
}

/*
 * eps = 0 with a zero gradient on zero moments is 0/0: treated as an
 * overflow, the step is skipped and no chunk is written.
 */
TEST_F(step, eps_zero_with_zero_gradient_is_skipped)
{
	struct ckpt_status st;

	memset(self->grad, 0, self->window);
	step_params(self, 1);
	self->hp[0].eps = 0;
	self->hp[1].eps = 0;
	self->hp[1].weight_decay = 0;	/* Adam-L2: g stays 0 */
	ASSERT_EQ(0, ck_begin(self->fd, 1, self->gs, self->hp, N_GROUPS));
	ASSERT_EQ(1, ck_model_step(&self->m, 1, self->hp, self->gs, self->grad, NULL));
	ASSERT_EQ(0, ck_grad(self->fd, &self->m, self->grad, 0, self->window));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(1, st.overflow);
	ASSERT_EQ(0, ck_commit(self->fd, 1, NULL, 0));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_RESULT_OVERFLOW, st.last_result);
	EXPECT_EQ(0, st.committed_step);
	EXPECT_EQ(0, verify(_metadata, self));
	ASSERT_EQ(0, full_step(_metadata, self, 1, "one"));
}

/* An image formatted without the p_lo checksum feature steps as before. */
TEST_F(step, image_without_plo_crc)
{
	struct ckpt_geometry g = self->m.sb.geo;

	close(self->fd);
	ck_remove(CK_NAME);
	ck_model_free(&self->m);
	ASSERT_EQ(0, ck_format_features(&self->m, ck_dev(), &g, 12, 0));
	ASSERT_EQ(0, create_default(&self->m, NULL));
	self->fd = ck_open_dm(CK_NAME);
	ASSERT_LE(0, self->fd);
	ASSERT_EQ(0, full_step(_metadata, self, 1, "one"));
	ASSERT_EQ(0, full_step(_metadata, self, 2, "two"));
}

TEST_HARNESS_MAIN
