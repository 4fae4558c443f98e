// SPDX-License-Identifier: GPL-2.0 OR MIT
// vm: cpu-independent
/*
 * Hostile input against the live target: random bytes into the control block,
 * the GRAD and PARAM windows and past the end, through O_DIRECT and buffered
 * I/O, of every size from 512 B to 8 MiB at odd offsets; garbage commands;
 * two processes racing BEGIN/COMMIT; `dmsetup message` with garbage
 * arguments. Each is refused (-EIO/-EINVAL, the status page says why), the
 * kernel logs no WARNING or oops (the guest runs panic_on_warn=1), and the
 * committed state is what the core's scalar reference says: the PARAM
 * window, and the backing device byte for byte once the target is removed.
 * Seeded, bounded: about a minute under TCG.
 */
#include "ckpt_kmod.h"
#include <signal.h>
#include <time.h>
#include <linux/dm-ioctl.h>
#include "kselftest_harness.h"

#define N_CHUNKS 16
#define SHIFT 14		/* 16384 params: 32 KiB of gradients per chunk */
#define N_GROUPS 2
#define BIG (8u << 20)		/* the largest I/O tried */

FIXTURE(hostile) {
	struct ck_model m;
	int fd;
	uint16_t *grad;		/* the same gradients for every step */
	struct ckpt_hparams hp[N_GROUPS];
	uint32_t gs;
	struct ck_rng rng;
	uint8_t *junk;		/* BIG random bytes, 4 KiB aligned */
	uint64_t rejects;	/* refusals counted by hand, to check the status page */
};

FIXTURE_SETUP(hostile)
{
	struct ckpt_geometry g = ck_geo(N_CHUNKS, SHIFT, N_GROUPS, CKPT_DTYPE_FP16);
	uint64_t i;

	ck_remove(CK_NAME);
	ASSERT_EQ(0, ck_format(&self->m, ck_dev(), &g, 7));
	self->rng.s = 1234;
	self->grad = calloc(self->m.l.n_params, 2);
	self->junk = ck_alloc(BIG);
	ASSERT_TRUE(self->grad && self->junk);
	for (i = 0; i < self->m.l.n_params; i++) {
		float f = (ck_uniform(&self->rng) - 0.5f) * 4.0f;	/* x 1/1024 below */
		uint32_t b;

		memcpy(&b, &f, 4);
		self->grad[i] = ckpt_f32_to_f16(b);
	}
	for (i = 0; i < BIG / 8; i++)
		((uint64_t *)self->junk)[i] = ck_next(&self->rng);
	self->gs = ck_f32(1.0 / 1024);
	ck_kmsg_clear();
	ASSERT_EQ(0, ck_create_ckpt(&self->m, CK_NAME, ck_dev(), NULL));
	self->fd = ck_open_dm(CK_NAME);
	ASSERT_LE(0, self->fd);
}

/* With the target gone, the backing device is the model's, byte for byte. */
FIXTURE_TEARDOWN(hostile)
{
	char why[256];

	if (self->fd >= 0)
		close(self->fd);
	ck_remove(CK_NAME);
	EXPECT_EQ(0, ck_model_verify(&self->m, why, sizeof(why))) TH_LOG("after remove: %s", why);
	EXPECT_EQ(0, ck_kmsg_bug());
	free(self->grad);
	free(self->junk);
	ck_model_free(&self->m);
}

static void hparams(FIXTURE_DATA(hostile) *self, uint64_t t)
{
	self->hp[0] = ck_hparams(1e-3, 0.9, 0.999, 1e-8, 0.01, 0, t);
	self->hp[1] = ck_hparams(2e-3, 0.8, 0.99, 1e-6, 0.1, 1, t);
}

/* One whole step t, the model following. */
static int step(FIXTURE_DATA(hostile) *self, uint64_t t)
{
	int r;

	hparams(self, t);
	r = ck_begin(self->fd, t, self->gs, self->hp, N_GROUPS);
	if (!r)
		r = ck_grad(self->fd, &self->m, self->grad, 0, self->m.l.window_bytes);
	if (!r)
		r = ck_commit(self->fd, t, "hostile", 7);
	if (r)
		return r;
	ck_model_step(&self->m, t, self->hp, self->gs, self->grad, NULL);
	ck_model_commit(&self->m, t, "hostile", 7);
	return 0;
}

/*
 * The committed state is the model's: the status page (step, idle), the
 * PARAM window (O_DIRECT) and the backing device byte for byte.
 */
static int committed_intact(struct __test_metadata *_metadata, FIXTURE_DATA(hostile) *self)
{
	const struct ck_model *m = &self->m;
	uint8_t *p = ck_alloc(m->l.window_bytes);
	struct ckpt_status st;
	char why[256];
	int r = -1;

	if (ck_status(self->fd, &st)) {
		TH_LOG("status page unreadable");
		goto out;
	}
	if (st.state != CKPT_STATE_IDLE || st.committed_step != m->sb.committed_step ||
	    st.committed_slot != m->sb.committed_slot) {
		TH_LOG("status: state %u step %llu slot %u, want idle %llu %u", st.state,
		       (unsigned long long)st.committed_step, st.committed_slot,
		       (unsigned long long)m->sb.committed_step, m->sb.committed_slot);
		goto out;
	}
	if (ck_params(self->fd, m, p, 0, m->l.window_bytes) ||
	    memcmp(p, m->plo[m->sb.committed_slot], m->l.window_bytes)) {
		TH_LOG("the PARAM window is not the committed params");
		goto out;
	}
	if (ck_model_verify(m, why, sizeof(why))) {
		TH_LOG("backing device: %s", why);
		goto out;
	}
	r = 0;
out:
	free(p);
	return r;
}

/* The places to aim at: region starts, odd sectors in them, the end. */
static void targets(const struct ck_model *m, uint64_t *at, int *n)
{
	const uint64_t end = m->l.virt_bytes;

	*n = 0;
	at[(*n)++] = 0;					/* control block */
	at[(*n)++] = 512;
	at[(*n)++] = 3 * 512;
	at[(*n)++] = m->l.grad_off;			/* GRAD */
	at[(*n)++] = m->l.grad_off + 7 * 512;
	at[(*n)++] = m->l.grad_off + m->l.plo_chunk_bytes - 512;
	at[(*n)++] = m->l.param_off - 512;		/* GRAD into PARAM */
	at[(*n)++] = m->l.param_off;			/* PARAM */
	at[(*n)++] = m->l.param_off + 5 * 512;
	at[(*n)++] = end - 512;				/* across the end */
	at[(*n)++] = end;				/* past it */
	at[(*n)++] = end + 9 * 512;
	at[(*n)++] = end + (1ull << 30);
}

static const uint32_t sizes[] = {
	512, 1024, 1536, 4096, 4608, 32768 + 512, 65536, 1u << 20, (1u << 20) + 512,
	(3u << 20) - 1536, BIG,
};

/*
 * With no step open, every write of random bytes anywhere is refused, and
 * the status page names the refusal; reads of the same shapes answer data,
 * EOF or an error, never an oops.
 */
TEST_F_TIMEOUT(hostile, random_bytes_everywhere_direct, 300)
{
	uint64_t at[16];
	uint8_t *rd = ck_alloc(BIG);
	struct ckpt_status st0, st;
	int n, i;
	size_t s;

	ASSERT_EQ(0, step(self, 1));
	ASSERT_EQ(0, ck_status(self->fd, &st0));
	targets(&self->m, at, &n);
	for (i = 0; i < n; i++) {
		for (s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
			const uint32_t len = sizes[s];
			const uint8_t *src = self->junk + (ck_next(&self->rng) % 64) * 4096;
			ssize_t w;

			if (src + len > self->junk + BIG)
				src = self->junk;
			w = pwrite(self->fd, src, len, (off_t)at[i]);
			if (w >= 0)
				TH_LOG("write of %u at %llu: %zd bytes accepted", len,
				       (unsigned long long)at[i], w);
			ASSERT_GT(0, w);
			EXPECT_TRUE(errno == EIO || errno == ENOSPC || errno == EINVAL)
				TH_LOG("write of %u at %llu: %s", len, (unsigned long long)at[i],
				       strerror(errno));
			/* an odd byte offset: the block layer refuses O_DIRECT */
			EXPECT_GT(0, pwrite(self->fd, src, len, (off_t)at[i] + 1));
			EXPECT_GT(0, pwrite(self->fd, src + 1, len, (off_t)at[i]));
			/* reads of the same shapes: data, a short read at the end, or EOF */
			w = pread(self->fd, rd, len, (off_t)at[i]);
			EXPECT_TRUE(w >= 0 || errno == EINVAL)
				TH_LOG("read of %u at %llu: %s", len, (unsigned long long)at[i],
				       strerror(errno));
			if (at[i] >= self->m.l.virt_bytes) {
				EXPECT_GE(0, w);
			}
			/* an odd byte offset: EINVAL, or EOF past the end */
			w = pread(self->fd, rd, len, (off_t)at[i] + 1);
			if (at[i] + 1 >= self->m.l.virt_bytes) {
				EXPECT_GE(0, w);
			} else {
				EXPECT_GT(0, w);
			}
		}
	}
	/* the status page tells why the last one was refused */
	ASSERT_EQ(0, ck_status(self->fd, &st));
	TH_LOG("%llu refusals recorded, last error %s",
	       (unsigned long long)(st.commands_rejected - st0.commands_rejected),
	       ckpt_strerror(st.last_error));
	EXPECT_LT(st0.commands_rejected + 20, st.commands_rejected);
	EXPECT_EQ(CKPT_RESULT_REJECTED, st.last_result);
	EXPECT_NE(0, st.last_error);
	EXPECT_EQ(0, st.first_io_error);
	EXPECT_EQ(st0.steps_committed, st.steps_committed);
	EXPECT_EQ(0, committed_intact(_metadata, self));
	/* and it still steps */
	ASSERT_EQ(0, step(self, 2));
	EXPECT_EQ(0, committed_intact(_metadata, self));
	free(rd);
}

/*
 * Buffered I/O at odd byte offsets: the page cache turns each write into a
 * read-modify-write of whole pages, which the target refuses at writeback
 * (fsync fails); nothing reaches the committed state.
 */
TEST_F_TIMEOUT(hostile, random_bytes_everywhere_buffered, 300)
{
	char path[64];
	uint64_t at[16];
	uint8_t rd[8192];
	int n, i, fd, accepted = 0;
	size_t s;

	ASSERT_EQ(0, step(self, 1));
	snprintf(path, sizeof(path), "/dev/mapper/%s", CK_NAME);
	targets(&self->m, at, &n);
	for (i = 0; i < n; i++) {
		for (s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
			const uint64_t off = at[i] + 1 + ck_next(&self->rng) % 511;
			const uint32_t len = sizes[s] - (uint32_t)(ck_next(&self->rng) % 7);
			ssize_t w;
			int f;

			fd = open(path, O_RDWR);
			ASSERT_LE(0, fd);
			w = pwrite(fd, self->junk, len, (off_t)off);
			f = fsync(fd);
			if (w > 0 && !f) {
				TH_LOG("buffered write of %u at %llu: written and flushed",
				       len, (unsigned long long)off);
				accepted++;
			}
			EXPECT_TRUE(w >= 0 || errno == ENOSPC || errno == EIO || errno == EFBIG);
			w = pread(fd, rd, sizeof(rd), (off_t)off);
			EXPECT_TRUE(w >= 0 || errno == EIO);
			/* drop what the page cache kept of it */
			ioctl(fd, BLKFLSBUF, 0);
			close(fd);
		}
	}
	EXPECT_EQ(0, accepted);
	EXPECT_EQ(0, committed_intact(_metadata, self));
	ASSERT_EQ(0, step(self, 2));
	EXPECT_EQ(0, committed_intact(_metadata, self));
}

/*
 * With a step open: junk into the control block, PARAM and past the end is
 * refused and leaves the step open; junk gradients are taken (they are
 * gradients); then garbage commands: random bytes, a valid command with bytes
 * flipped, and well-formed commands with hostile fields. ABORT, and the
 * committed state is the last commit.
 */
TEST_F_TIMEOUT(hostile, garbage_with_a_step_open, 300)
{
	struct ckpt_cmd *cmd = calloc(1, sizeof(*cmd));
	uint8_t *b = ck_alloc(CKPT_BLOCK);
	struct ckpt_status st;
	uint64_t at[16];
	int n, i, k, sent = 0;
	size_t s;

	ASSERT_EQ(0, step(self, 1));
	hparams(self, 2);
	ASSERT_EQ(0, ck_begin(self->fd, 2, self->gs, self->hp, N_GROUPS));
	targets(&self->m, at, &n);
	for (i = 0; i < n; i++) {
		if (at[i] >= self->m.l.grad_off && at[i] < self->m.l.param_off)
			continue;
		for (s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
			EXPECT_GT(0, pwrite(self->fd, self->junk, sizes[s], (off_t)at[i]));
	}
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_OPEN, st.state);
	EXPECT_EQ(2, st.open_step);

	/* random bytes as commands, of every length up to the block */
	for (k = 0; k < 64; k++) {
		uint32_t len = 512 * (1 + (uint32_t)(ck_next(&self->rng) % 8));

		EXPECT_EQ(-EIO, ck_pwrite(self->fd, self->junk + 4096 * k, len, 0));
	}
	/* a valid COMMIT with one bit flipped anywhere in it */
	cmd->opcode = CKPT_OP_COMMIT;
	cmd->step = 2;
	cmd->blob_len = 100;
	for (k = 0; k < 200; k++) {
		int len = ckpt_cmd_encode(cmd, b);
		uint32_t bit = (uint32_t)(ck_next(&self->rng) % ((uint32_t)len * 8));

		ASSERT_LT(0, len);
		b[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		EXPECT_EQ(-EIO, ck_pwrite(self->fd, b, 512, 0));
	}
	/* well-formed, hostile fields */
	for (k = 0; k < 300; k++) {
		uint64_t r = ck_next(&self->rng);

		memset(cmd, 0, sizeof(*cmd));
		cmd->opcode = (uint32_t)(r % (CKPT_OP_ROLLBACK + 1));	/* a step is open */
		cmd->step = (r & 8) ? ck_next(&self->rng) : (r >> 8) % 4;
		cmd->grad_scale = (uint32_t)ck_next(&self->rng);
		cmd->n_groups = 1 + (uint32_t)((r >> 16) % CKPT_MAX_GROUPS);
		for (i = 0; i < (int)cmd->n_groups; i++) {
			uint32_t *w = (uint32_t *)&cmd->groups[i];
			size_t j;

			for (j = 0; j < sizeof(cmd->groups[i]) / 4; j++)
				w[j] = (uint32_t)ck_next(&self->rng);
		}
		cmd->blob_len = (uint32_t)((r >> 24) % (CKPT_BLOB_MAX + 1));
		memcpy(cmd->blob, self->junk, cmd->blob_len);
		if (cmd->opcode == CKPT_OP_COMMIT && cmd->step == 2)
			cmd->step = 3;	/* the one command that would be right */
		if (cmd->opcode == CKPT_OP_ABORT && (cmd->step == 2 || cmd->step == 0))
			cmd->step = 5;
		if (ckpt_cmd_encode(cmd, b) < 0)
			continue;
		sent++;
		EXPECT_EQ(-EIO, ck_pwrite(self->fd, b, CKPT_BLOCK, 0))
			TH_LOG("command %u step %llu accepted", cmd->opcode,
			       (unsigned long long)cmd->step);
	}
	TH_LOG("%d well-formed hostile commands sent", sent);
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_OPEN, st.state);
	EXPECT_EQ(2, st.open_step);
	EXPECT_EQ(CKPT_RESULT_REJECTED, st.last_result);

	/* junk gradients are gradients: some are taken, the rest written twice */
	memset(self->m.valid[self->m.sb.committed_slot ^ 1], 0, sizeof(self->m.valid[0]));
	for (s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		uint64_t off = (ck_next(&self->rng) % (self->m.l.window_bytes / 512)) * 512;

		if (pwrite(self->fd, self->junk, sizes[s], (off_t)(self->m.l.grad_off + off)) < 0)
			EXPECT_EQ(EIO, errno);
	}
	EXPECT_EQ(0, ck_abort(self->fd, 2));
	EXPECT_EQ(0, committed_intact(_metadata, self));
	ASSERT_EQ(0, step(self, 2));
	EXPECT_EQ(0, committed_intact(_metadata, self));
	free(cmd);
	free(b);
}

/*
 * Two processes drive the same device: each loops BEGIN(committed + 1), all
 * gradients, COMMIT, now and then an ABORT. Every step's gradients are the
 * same, so whichever writes land, a committed step t is the model's step t.
 */
static void racer(FIXTURE_DATA(hostile) *self, uint64_t seed, uint64_t last, time_t until)
{
	struct ck_rng r = { seed };
	struct ckpt_status st;
	struct ckpt_hparams hp[N_GROUPS];
	int fd = ck_open_dm(CK_NAME);

	if (fd < 0)
		_exit(2);
	while (time(NULL) < until) {
		const uint64_t cb = self->m.l.plo_chunk_bytes;
		uint32_t order[N_CHUNKS], c, j, k;
		uint64_t t, off;

		if (ck_status(fd, &st))
			_exit(3);
		if (st.committed_step >= last)
			break;
		t = st.committed_step + 1;
		hp[0] = ck_hparams(1e-3, 0.9, 0.999, 1e-8, 0.01, 0, t);
		hp[1] = ck_hparams(2e-3, 0.8, 0.99, 1e-6, 0.1, 1, t);
		ck_begin(fd, t, self->gs, hp, N_GROUPS);
		/*
		 * Chunks in a random order, whole or in two staged halves: the
		 * other racer's writes are either the same pieces (E_TWICE) or
		 * cover them, so no sector is ever left out.
		 */
		for (c = 0; c < N_CHUNKS; c++)
			order[c] = c;
		for (c = N_CHUNKS - 1; c > 0; c--) {
			j = (uint32_t)(ck_next(&r) % (c + 1));
			k = order[c];
			order[c] = order[j];
			order[j] = k;
		}
		for (c = 0; c < N_CHUNKS; c++) {
			off = order[c] * cb;
			if (ck_next(&r) & 1) {
				ck_grad(fd, &self->m, self->grad, off, cb);
			} else {
				ck_grad(fd, &self->m, self->grad, off + cb / 2, cb / 2);
				ck_grad(fd, &self->m, self->grad, off, cb / 2);
			}
		}
		if (ck_next(&r) % 4 == 0)
			ck_abort(fd, t);
		ck_commit(fd, t, "hostile", 7);
	}
	close(fd);
	_exit(0);
}

TEST_F_TIMEOUT(hostile, two_processes_race_begin_commit, 300)
{
	const uint64_t last = 6;
	time_t until = time(NULL) + 60;
	struct ckpt_status st;
	pid_t pid[2];
	int i, status;
	uint64_t t;

	for (i = 0; i < 2; i++) {
		pid[i] = fork();
		ASSERT_LE(0, pid[i]);
		if (!pid[i])
			racer(self, 100 + (uint64_t)i, last, until);
	}
	for (i = 0; i < 2; i++) {
		ASSERT_EQ(pid[i], waitpid(pid[i], &status, 0));
		EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	ASSERT_EQ(0, ck_status(self->fd, &st));
	TH_LOG("committed %llu steps, %llu aborted, %llu refusals",
	       (unsigned long long)st.committed_step, (unsigned long long)st.steps_aborted,
	       (unsigned long long)st.commands_rejected);
	/* the racers may leave a step open (one began while the other committed) */
	if (st.state == CKPT_STATE_OPEN)
		ASSERT_EQ(0, ck_abort(self->fd, st.open_step));
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_LT(0, st.committed_step);
	EXPECT_LE(st.committed_step, last);
	for (t = 1; t <= st.committed_step; t++) {
		hparams(self, t);
		ck_model_step(&self->m, t, self->hp, self->gs, self->grad, NULL);
		ck_model_commit(&self->m, t, "hostile", 7);
	}
	/* the slot not committed holds whatever the last attempt left */
	memset(self->m.valid[self->m.sb.committed_slot ^ 1], 0, sizeof(self->m.valid[0]));
	EXPECT_EQ(0, committed_intact(_metadata, self));
	ASSERT_EQ(0, step(self, st.committed_step + 1));
	EXPECT_EQ(0, committed_intact(_metadata, self));
}

/* "stats", or a BEGIN of step 2 (the groups may be right): may succeed. */
static int may_be_taken(const char *m)
{
	char buf[12000], *save, *w0, *w1, *end;
	unsigned long long t;

	snprintf(buf, sizeof(buf), "%s", m);
	w0 = strtok_r(buf, " \t\n\v\f\r", &save);
	w1 = strtok_r(NULL, " \t\n\v\f\r", &save);
	if (!w0)
		return 0;
	if (!strcasecmp(w0, "stats") && !w1)
		return 1;
	if (strcasecmp(w0, "begin") || !w1)
		return 0;
	t = strtoull(w1 + (*w1 == '+'), &end, 10);
	return t == 2 && !*end;
}

/*
 * Messages of random words: the verbs, numbers (huge, negative, hex, with
 * junk), group tokens (valid, short, long, bad hex), blobs (odd, huge, not
 * hex), nothing at all. None but a bare "stats" may be taken.
 */
TEST_F_TIMEOUT(hostile, garbage_messages, 300)
{
	static const char *const words[] = {
		"begin", "commit", "abort", "stats", "BEGIN", "Commit", "", " ", "0", "1", "2", "-1",
		"18446744073709551615", "18446744073709551616", "99999999999999999999999999",
		"9223372036854775808", "0x10", "1e3", "+2", "ffffffff", "100000000", "7fc00000",
		"nan", "3f800000,3f800000", ",,,,,,,,,,", "626c6f62", "626c6f6", "zz", "\t",
		"%s%n%x", "begin\x01", "\xff\xfe",
	};
	const size_t nw = sizeof(words) / sizeof(words[0]);
	char good[2][160], m[12000], out[4096];
	struct ckpt_status st;
	int k, w, r, taken = 0, n_dmsetup = 0;

	ASSERT_EQ(0, step(self, 1));
	hparams(self, 2);
	for (k = 0; k < N_GROUPS; k++) {
		const struct ckpt_hparams *h = &self->hp[k];

		snprintf(good[k], sizeof(good[k]),
			 "%08x,%08x,%08x,%08x,%08x,%08x,%08x,%08x,%08x,%08x,%x", h->lr, h->beta1,
			 h->beta2, h->eps, h->weight_decay, h->one_minus_beta1,
			 h->one_minus_beta2, h->step_size, h->bc2_sqrt, h->decay, h->flags);
	}
	EXPECT_GT(0, ck_dm_message(CK_NAME, ""));
	for (k = 0; k < 3000; k++) {
		uint64_t r0 = ck_next(&self->rng);
		int n = (int)(r0 % 8), len = 0;

		m[0] = 0;
		for (w = 0; w < n && len < (int)sizeof(m) - 200; w++) {
			uint64_t x = ck_next(&self->rng);
			const char *word = words[x % nw];
			char tmp[200];

			switch ((x >> 8) % 6) {
			case 0:	/* a valid group token, maybe cut or extended */
				snprintf(tmp, sizeof(tmp), "%s%s", good[x & 1],
					 (x >> 16) & 1 ? ",0" : "");
				if ((x >> 17) & 1)
					tmp[(x >> 20) % strlen(tmp)] = 0;
				word = tmp;
				break;
			case 1:	/* a number */
				snprintf(tmp, sizeof(tmp), "%llu", (unsigned long long)(x >> (x & 63)));
				word = tmp;
				break;
			case 2:	/* a long hex blob, odd or even */
				len += snprintf(m + len, sizeof(m) - (size_t)len, "%s",
						w ? " " : "");
				for (r = 0; r < (int)((x >> 12) % 5000) && len < (int)sizeof(m) - 300;
				     r++)
					m[len++] = "0123456789abcdefg"[(x >> (r % 60)) % 17];
				m[len] = 0;
				continue;
			default:
				break;
			}
			len += snprintf(m + len, sizeof(m) - (size_t)len, "%s%s", w ? " " : "", word);
		}
		if (may_be_taken(m))
			continue;
		r = ck_dm_message(CK_NAME, m);
		if (!r) {
			TH_LOG("message '%.200s' taken", m);
			taken++;
		}
		/* through dmsetup too, now and then (it forks: slow) */
		if (k % 100 == 0 && strlen(m) < 3000 && !strchr(m, '\'')) {
			n_dmsetup++;
			EXPECT_NE(0, ck_sh(out, sizeof(out), "dmsetup message %s 0 '%s' 2>&1",
					   CK_NAME, m));
		}
	}
	EXPECT_EQ(0, taken);
	TH_LOG("3000 messages, %d through dmsetup", n_dmsetup);
	/* hostile steps and scales in otherwise valid messages */
	snprintf(m, sizeof(m), "begin 18446744073709551615 %08x %s %s", self->gs, good[0], good[1]);
	EXPECT_GT(0, ck_dm_message(CK_NAME, m));
	snprintf(m, sizeof(m), "begin 0 %08x %s %s", self->gs, good[0], good[1]);
	EXPECT_GT(0, ck_dm_message(CK_NAME, m));
	snprintf(m, sizeof(m), "begin 2 %08x %s", self->gs, good[0]);
	EXPECT_GT(0, ck_dm_message(CK_NAME, m));
	snprintf(m, sizeof(m), "begin 2 %08x %s %s %s", self->gs, good[0], good[1], good[0]);
	EXPECT_GT(0, ck_dm_message(CK_NAME, m));
	EXPECT_GT(0, ck_dm_message(CK_NAME, "commit 2"));
	EXPECT_GT(0, ck_dm_message(CK_NAME, "commit 1"));
	EXPECT_GT(0, ck_dm_message(CK_NAME, "commit 18446744073709551615 00"));
	EXPECT_GT(0, ck_dm_message(CK_NAME, "abort 18446744073709551615"));
	EXPECT_GT(0, ck_dm_message(CK_NAME, "stats x"));
	/* a NaN scale opens a step whose every chunk overflows: nothing commits */
	snprintf(m, sizeof(m), "begin 2 7fc00000 %s %s", good[0], good[1]);
	if (!ck_dm_message(CK_NAME, m)) {
		ck_grad(self->fd, &self->m, self->grad, 0, self->m.l.window_bytes);
		EXPECT_EQ(0, ck_sh(out, sizeof(out), "dmsetup message %s 0 commit 2 2>&1", CK_NAME));
		EXPECT_NE(NULL, strstr(out, "overflow 2")) TH_LOG("%s", out);
	}
	ASSERT_EQ(0, ck_status(self->fd, &st));
	EXPECT_EQ(CKPT_STATE_IDLE, st.state);
	EXPECT_EQ(0, committed_intact(_metadata, self));
	ASSERT_EQ(0, step(self, 2));
	EXPECT_EQ(0, committed_intact(_metadata, self));
}

TEST_HARNESS_MAIN
