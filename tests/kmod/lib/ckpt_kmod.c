// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * The helpers of the dm-ckpt kernel tests (ckpt_kmod.h says what each does),
 * linked into every tests/kmod program.
 */
#include "ckpt_kmod.h"

const char *ck_dev(void)
{
	const char *d = getenv("CKPT_TEST_DEV");

	return d && *d ? d : "/dev/nvme0n1";
}

void ck_devno(const char *path, char *out, size_t n)
{
	struct stat st;

	if (stat(path, &st) < 0)
		snprintf(out, n, "?");
	else
		snprintf(out, n, "%u:%u", major(st.st_rdev), minor(st.st_rdev));
}

uint64_t ck_dev_bytes(const char *path)
{
	uint64_t size = 0;
	int fd = open(path, O_RDONLY);

	if (fd >= 0) {
		if (ioctl(fd, BLKGETSIZE64, &size) < 0)
			size = 0;
		close(fd);
	}
	return size;
}

int ck_sh(char *out, size_t outlen, const char *fmt, ...)
{
	char cmd[8192];
	va_list ap;
	FILE *f;
	size_t n = 0;
	int st;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	f = popen(cmd, "r");
	if (!f)
		return -1;
	if (out && outlen) {
		while (n + 1 < outlen) {
			size_t r = fread(out + n, 1, outlen - 1 - n, f);

			if (!r)
				break;
			n += r;
		}
		out[n] = 0;
	} else {
		char sink[512];

		while (fread(sink, 1, sizeof(sink), f))
			;
	}
	st = pclose(f);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void ck_kmsg_clear(void)
{
	klogctl(5 /* SYSLOG_ACTION_CLEAR */, NULL, 0);
}

char *ck_kmsg(void)
{
	int n = klogctl(10 /* SYSLOG_ACTION_SIZE_BUFFER */, NULL, 0);
	char *buf;

	if (n <= 0)
		n = 1 << 20;
	buf = calloc(1, (size_t)n + 1);
	if (!buf)
		return NULL;
	n = klogctl(3 /* SYSLOG_ACTION_READ_ALL */, buf, n);
	buf[n > 0 ? n : 0] = 0;
	return buf;
}

int ck_kmsg_has(const char *s)
{
	char *log = ck_kmsg();
	int r = log && strstr(log, s) != NULL;

	free(log);
	return r;
}

int ck_kmsg_bug(void)
{
	static const char *const bad[] = {
		"BUG:", "Oops", "WARNING:", "Call Trace", "general protection", "UBSAN",
	};
	char *log = ck_kmsg();
	int r = 0;
	size_t i;

	for (i = 0; log && i < sizeof(bad) / sizeof(bad[0]); i++)
		if (strstr(log, bad[i]))
			r = 1;
	free(log);
	return r;
}

void *ck_alloc(size_t n)
{
	void *p = NULL;

	if (posix_memalign(&p, CKPT_BLOCK, n ? n : CKPT_BLOCK))
		return NULL;
	memset(p, 0, n);
	return p;
}

int ck_pwrite(int fd, const void *buf, size_t n, uint64_t off)
{
	ssize_t r = pwrite(fd, buf, n, (off_t)off);

	if (r < 0)
		return -errno;
	return (size_t)r == n ? 0 : -EIO;
}

int ck_pread(int fd, void *buf, size_t n, uint64_t off)
{
	ssize_t r = pread(fd, buf, n, (off_t)off);

	if (r < 0)
		return -errno;
	return (size_t)r == n ? 0 : -EIO;
}

int ck_write_dev(const char *dev, const void *src, size_t n, uint64_t off)
{
	int fd = open(dev, O_RDWR | O_DIRECT);
	int r;

	if (fd < 0)
		return -errno;
	r = ck_write_at(fd, src, n, off);
	if (!r && fsync(fd))
		r = -errno;
	close(fd);
	return r;
}

int ck_write_at(int fd, const void *src, size_t n, uint64_t off)
{
	void *b = ck_alloc(n);
	int r;

	if (!b)
		return -ENOMEM;
	memcpy(b, src, n);
	r = ck_pwrite(fd, b, n, off);
	free(b);
	return r;
}

int ck_read_at(int fd, void *dst, size_t n, uint64_t off)
{
	void *b = ck_alloc(n);
	int r;

	if (!b)
		return -ENOMEM;
	r = ck_pread(fd, b, n, off);
	memcpy(dst, b, n);
	free(b);
	return r;
}

uint64_t ck_next(struct ck_rng *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

float ck_uniform(struct ck_rng *r)
{
	return (float)(ck_next(r) >> 40) / (float)(1u << 24);
}

uint32_t ck_f32(double d)
{
	float f = (float)d;
	uint32_t u;

	memcpy(&u, &f, 4);
	return u;
}

void ck_bf16_grads(struct ck_rng *r, uint16_t *grad, uint64_t n)
{
	uint64_t i;

	for (i = 0; i < n; i++) {
		float g = (ck_uniform(r) - 0.5f) * 2e-2f;
		uint32_t b;

		memcpy(&b, &g, 4);
		grad[i] = ckpt_f32_to_bf16(b);
	}
}

struct ckpt_hparams ck_hparams(double lr, double beta1, double beta2,
						double eps, double wd, int l2, uint64_t t)
{
	struct ckpt_hparams h;
	double bc1 = 1.0 - pow(beta1, (double)t), bc2 = 1.0 - pow(beta2, (double)t);

	memset(&h, 0, sizeof(h));
	h.lr = ck_f32(lr);
	h.beta1 = ck_f32(beta1);
	h.beta2 = ck_f32(beta2);
	h.eps = ck_f32(eps);
	h.weight_decay = ck_f32(wd);
	h.one_minus_beta1 = ck_f32(1.0 - beta1);
	h.one_minus_beta2 = ck_f32(1.0 - beta2);
	h.step_size = ck_f32(lr / bc1);
	h.bc2_sqrt = ck_f32(sqrt(bc2));
	h.decay = ck_f32(l2 ? 1.0 : 1.0 - lr * wd);
	h.flags = l2 ? CKPT_GROUP_ADAM_L2 : 0;
	return h;
}

void ck_model_free(struct ck_model *m)
{
	int s;

	for (s = 0; s < 2; s++) {
		free(m->state[s]);
		free(m->plo[s]);
		free(m->counts[s]);
		m->state[s] = NULL;
		m->plo[s] = NULL;
		m->counts[s] = NULL;
	}
}

struct ckpt_geometry ck_geo(uint32_t n_chunks, uint32_t shift,
					     uint32_t n_groups, uint32_t dtype)
{
	struct ckpt_geometry g;

	memset(&g, 0, sizeof(g));
	g.n_chunks = n_chunks;
	g.chunk_shift = shift;
	g.n_groups = n_groups;
	g.dtype = dtype;
	g.optimizer = CKPT_OPT_ADAM;
	g.manifest_bytes = CKPT_BLOCK;
	return g;
}

void ck_record_block(const struct ck_model *m, int slot, uint32_t c,
				      uint8_t *out)
{
	const uint32_t incompat = m->sb.feature_incompat;
	uint32_t b, bpc = m->cp / CKPT_TENSOR_ALIGN;

	memset(out, 0, CKPT_BLOCK);	/* no block counts: zeros after the header */
	if (incompat & CKPT_FEATURE_INCOMPAT_COUNTS) {
		for (b = 0; b < bpc; b++)
			ckpt_rec_set_count(out, b, m->counts[slot][(size_t)c * bpc + b]);
		ckpt_rec_seal(out, NULL, NULL, &m->rec[slot][c], incompat);
	} else {
		ckpt_rec_encode(&m->rec[slot][c], out);
	}
	memcpy(out + CKPT_BLOCK, m->state[slot] + (size_t)c * 3 * m->cp, 12 * (size_t)m->cp);
}

int ck_flip_record_data(const struct ck_model *m, uint32_t slot, uint32_t c,
					 size_t i, uint8_t mask)
{
	uint64_t off = ckpt_record_offset(&m->l, slot, c) + CKPT_BLOCK;
	uint8_t *blk = ck_alloc(CKPT_BLOCK);
	int fd, r;

	if (!blk)
		return -ENOMEM;
	fd = open(ck_dev(), O_RDWR | O_DIRECT);
	if (fd < 0) {
		free(blk);
		return -errno;
	}
	r = ck_pread(fd, blk, CKPT_BLOCK, off);
	blk[i] ^= mask;
	if (!r)
		r = ck_pwrite(fd, blk, CKPT_BLOCK, off);
	if (!r && fsync(fd))
		r = -errno;
	close(fd);
	free(blk);
	return r;
}

int ck_format_features(struct ck_model *m, const char *dev,
					const struct ckpt_geometry *g, uint64_t seed,
					uint32_t incompat)
{
	struct ck_rng r = { seed };
	uint8_t *blk = NULL;
	uint64_t n_params, i;
	uint32_t c, s;
	int fd, ret = -ENOMEM;

	memset(m, 0, sizeof(*m));
	m->dev = dev;
	if (ckpt_regions_compute(g, &m->l) || g->n_chunks > CK_MAX_CHUNKS)
		return -EINVAL;
	m->cp = (uint32_t)m->l.chunk_params;
	n_params = m->l.n_params;
	for (s = 0; s < 2; s++) {
		m->state[s] = calloc(n_params * 3, 4);
		m->plo[s] = calloc(n_params, 2);
		if (!m->state[s] || !m->plo[s])
			return -ENOMEM;
		/* COUNTS: every block at count 0, the formatted step */
		if (incompat & CKPT_FEATURE_INCOMPAT_COUNTS) {
			m->counts[s] = calloc(n_params / CKPT_TENSOR_ALIGN, 8);
			if (!m->counts[s])
				return -ENOMEM;
		}
	}
	for (c = 0; c < g->n_chunks; c++) {
		uint32_t *p = m->state[0] + (size_t)c * 3 * m->cp;

		m->groups[c] = (uint8_t)(c % g->n_groups);
		for (i = 0; i < m->cp; i++)
			p[i] = ck_f32((ck_uniform(&r) - 0.5f) * 0.2f);
		ckpt_round_params_scalar(g->dtype, p, m->plo[0] + (size_t)c * m->cp, m->cp);
		m->rec[0][c].chunk = c;
		m->rec[0][c].slot = 0;
		m->rec[0][c].chunk_shift = g->chunk_shift;
		m->rec[0][c].step = 0;
		m->rec[0][c].sequence = 1;
		m->rec[0][c].data_crc = ckpt_crc32c(p, 12 * (size_t)m->cp);
		if (incompat & CKPT_FEATURE_INCOMPAT_PLO_CRC)
			m->rec[0][c].plo_crc = ckpt_plo_crc(m->plo[0] + (size_t)c * m->cp,
							    g->chunk_shift);
		m->valid[0][c] = 1;
	}

	memset(&m->sb, 0, sizeof(m->sb));
	m->sb.feature_incompat = incompat;
	for (i = 0; i < 16; i++)
		m->sb.uuid[i] = (uint8_t)ck_next(&r);
	m->sb.sequence = 1;
	m->sb.geo = *g;
	m->sb.regions = m->l;
	m->sb.committed_step = 0;
	m->sb.committed_slot = 0;

	fd = open(dev, O_RDWR | O_DIRECT);
	if (fd < 0)
		return -errno;
	if (ck_dev_bytes(dev) < m->l.dev_bytes) {
		ret = -ENOSPC;
		goto out;
	}
	blk = ck_alloc(m->l.dev_bytes);
	if (!blk)
		goto out;
	/* the whole layout at once: zeros, then what is not zero */
	for (c = 0; c < g->n_chunks; c++)
		blk[m->l.group_off + c] = m->groups[c];
	memcpy(blk + m->l.plo_off[0], m->plo[0], n_params * 2);
	for (c = 0; c < g->n_chunks; c++)
		ck_record_block(m, 0, c, blk + ckpt_record_offset(&m->l, 0, c));
	ret = ckpt_sb_encode(&m->sb, blk + CKPT_BLOCK);
	if (ret) {
		ret = -EINVAL;
		goto out;
	}
	ret = ck_pwrite(fd, blk, m->l.dev_bytes, 0);
	if (!ret && fsync(fd))
		ret = -errno;
out:
	free(blk);
	close(fd);
	return ret;
}

int ck_format(struct ck_model *m, const char *dev,
			       const struct ckpt_geometry *g, uint64_t seed)
{
	return ck_format_features(m, dev, g, seed, CKPT_FEATURE_INCOMPAT_PLO_CRC);
}

int ck_format_sparse(struct ckpt_sb *sb, const char *dev,
				      const struct ckpt_geometry *g, uint64_t seed)
{
	struct ck_rng r = { seed };
	uint64_t gbytes;
	uint8_t *blk;
	int fd, ret, i;

	memset(sb, 0, sizeof(*sb));
	sb->feature_incompat = CKPT_FEATURE_INCOMPAT_PLO_CRC;
	if (ckpt_regions_compute_features(g, sb->feature_incompat, &sb->regions))
		return -EINVAL;
	if (ck_dev_bytes(dev) < sb->regions.dev_bytes)
		return -ENOSPC;
	for (i = 0; i < 16; i++)
		sb->uuid[i] = (uint8_t)ck_next(&r);
	sb->sequence = 1;
	sb->geo = *g;
	gbytes = sb->regions.group_bytes;
	blk = ck_alloc(gbytes > 2 * CKPT_BLOCK ? gbytes : 2 * CKPT_BLOCK);
	if (!blk)
		return -ENOMEM;
	fd = open(dev, O_RDWR | O_DIRECT);
	if (fd < 0) {
		free(blk);
		return -errno;
	}
	/* zeros: every chunk in group 0 */
	ret = ck_pwrite(fd, blk, gbytes, sb->regions.group_off);
	if (!ret)
		ret = ckpt_sb_encode(sb, blk + CKPT_BLOCK) ? -EINVAL :
		      ck_pwrite(fd, blk, 2 * CKPT_BLOCK, 0);
	if (!ret && fsync(fd))
		ret = -errno;
	close(fd);
	free(blk);
	return ret;
}

int ck_write_sb_block(const char *dev, const void *block, int k)
{
	int fd = open(dev, O_RDWR | O_DIRECT);
	int r;

	if (fd < 0)
		return -errno;
	r = ck_write_at(fd, block, CKPT_BLOCK, (uint64_t)k * CKPT_BLOCK);
	fsync(fd);
	close(fd);
	return r;
}

int ck_model_step_modes(struct ck_model *m, uint64_t t,
					 const struct ckpt_hparams *hp, uint32_t grad_scale,
					 const uint16_t *grad, const int *which,
					 const uint8_t *modes, const struct ckpt_bias *bias)
{
	const uint32_t src = m->sb.committed_slot, dst = src ^ 1;
	const uint32_t bpc = m->cp / CKPT_TENSOR_ALIGN;
	const int counts = !!(m->sb.feature_incompat & CKPT_FEATURE_INCOMPAT_COUNTS);
	uint32_t c, b, *buf = malloc(12 * (size_t)m->cp);
	uint16_t *plo = malloc(2 * (size_t)m->cp);
	int overflow = 0;

	for (c = 0; c < m->sb.geo.n_chunks; c++) {
		const uint32_t *s = m->state[src] + (size_t)c * 3 * m->cp;
		uint32_t nf = 0;

		if (which && !which[c])
			continue;
		memcpy(buf, s, 12 * (size_t)m->cp);
		for (b = 0; b < bpc; b++) {
			const size_t at = (size_t)b * CKPT_TENSOR_ALIGN;
			const uint8_t mode = modes ? modes[(size_t)c * bpc + b] : 0;
			struct ckpt_hparams h = hp[m->groups[c]];

			if (mode == CKPT_MODE_SKIP) {
				ckpt_round_params_scalar(m->sb.geo.dtype, buf + at, plo + at,
							 CKPT_TENSOR_ALIGN);
				continue;
			}
			if (mode) {
				h.step_size = bias[mode - 1].step_size;
				h.bc2_sqrt = bias[mode - 1].bc2_sqrt;
			}
			nf += ckpt_update_chunk_scalar(&h, grad_scale, m->sb.geo.dtype,
						       grad + (size_t)c * m->cp + at, buf + at,
						       buf + m->cp + at, buf + 2 * m->cp + at, plo + at,
						       CKPT_TENSOR_ALIGN);
		}
		if (nf) {
			overflow = 1;
			continue;
		}
		memcpy(m->state[dst] + (size_t)c * 3 * m->cp, buf, 12 * (size_t)m->cp);
		memcpy(m->plo[dst] + (size_t)c * m->cp, plo, 2 * (size_t)m->cp);
		for (b = 0; counts && b < bpc; b++) {
			const size_t k = (size_t)c * bpc + b;

			m->counts[dst][k] = m->counts[src][k] +
					    (!modes || modes[k] != CKPT_MODE_SKIP);
		}
		m->rec[dst][c].chunk = c;
		m->rec[dst][c].slot = dst;
		m->rec[dst][c].chunk_shift = m->sb.geo.chunk_shift;
		m->rec[dst][c].step = t;
		m->rec[dst][c].sequence = m->sb.sequence + 1;
		m->rec[dst][c].data_crc = ckpt_crc32c(buf, 12 * (size_t)m->cp);
		m->rec[dst][c].plo_crc = 0;
		if (m->sb.feature_incompat & CKPT_FEATURE_INCOMPAT_PLO_CRC)
			m->rec[dst][c].plo_crc = ckpt_plo_crc(plo, m->sb.geo.chunk_shift);
		m->valid[dst][c] = 1;
	}
	free(buf);
	free(plo);
	return overflow;
}

int ck_model_step(struct ck_model *m, uint64_t t,
				   const struct ckpt_hparams *hp, uint32_t grad_scale,
				   const uint16_t *grad, const int *which)
{
	return ck_model_step_modes(m, t, hp, grad_scale, grad, which, NULL, NULL);
}

void ck_model_commit(struct ck_model *m, uint64_t t, const void *blob,
				      uint32_t blob_len)
{
	m->sb.sequence++;
	m->sb.committed_step = t;
	m->sb.committed_slot ^= 1;
	m->sb.blob_len = blob_len;
	memset(m->sb.blob, 0, sizeof(m->sb.blob));
	if (blob_len)
		memcpy(m->sb.blob, blob, blob_len);
}

void ck_model_rollback(struct ck_model *m, const char *blob)
{
	uint32_t c, slot = m->sb.committed_slot ^ 1;

	ck_model_commit(m, m->sb.committed_step - 1, blob, (uint32_t)strlen(blob));
	m->sb.committed_slot = slot;
	for (c = 0; c < m->sb.geo.n_chunks; c++)
		m->rec[slot][c].sequence = m->sb.sequence;
}

int ck_model_verify(const struct ck_model *m, char *why, size_t n)
{
	uint8_t *blk = ck_alloc(m->l.dev_bytes), *want = ck_alloc(m->l.record_bytes);
	int fd = open(m->dev, O_RDONLY | O_DIRECT);
	int ret = -1, s;
	uint32_t c;

	snprintf(why, n, "cannot read %s", m->dev);
	if (fd < 0 || !blk || !want || ck_pread(fd, blk, m->l.dev_bytes, 0))
		goto out;
	if (ckpt_sb_encode(&m->sb, want) ||
	    memcmp(want, blk + (m->sb.sequence & 1) * CKPT_BLOCK, CKPT_BLOCK)) {
		snprintf(why, n, "superblock copy %d differs (sequence %llu)",
			 (int)(m->sb.sequence & 1), (unsigned long long)m->sb.sequence);
		goto out;
	}
	for (s = 0; s < 2; s++) {
		for (c = 0; c < m->sb.geo.n_chunks; c++) {
			if (!m->valid[s][c])
				continue;
			ck_record_block(m, s, c, want);
			if (memcmp(want, blk + ckpt_record_offset(&m->l, s, c), m->l.record_bytes)) {
				snprintf(why, n, "record of chunk %u slot %d differs", c, s);
				goto out;
			}
			if (memcmp(m->plo[s] + (size_t)c * m->cp, blk + ckpt_plo_offset(&m->l, s, c),
				   m->l.plo_chunk_bytes)) {
				snprintf(why, n, "p_lo of chunk %u slot %d differs", c, s);
				goto out;
			}
		}
	}
	ret = 0;
out:
	if (fd >= 0)
		close(fd);
	free(blk);
	free(want);
	return ret;
}

uint64_t ck_sectors(const struct ck_model *m)
{
	return m->l.virt_bytes / 512;
}

int ck_create(const char *name, const char *table)
{
	if (ck_sh(NULL, 0, "dmsetup create %s --noudevsync --table '%s' 2>&1", name, table))
		return -1;
	return ck_sh(NULL, 0, "dmsetup mknodes %s 2>&1", name) ? -1 : 0;
}

int ck_reload(const char *name, const char *table)
{
	if (ck_sh(NULL, 0, "dmsetup suspend --noudevsync %s 2>&1", name) ||
	    ck_sh(NULL, 0, "dmsetup load --noudevsync %s --table '%s' 2>&1", name, table) ||
	    ck_sh(NULL, 0, "dmsetup resume --noudevsync %s 2>&1", name))
		return -1;
	return 0;
}

void ck_remove(const char *name)
{
	ck_sh(NULL, 0, "dmsetup remove --noudevsync %s 2>&1", name);
}

int ck_create_ckpt(const struct ck_model *m, const char *name,
				    const char *backing, const char *opts)
{
	char table[512];

	snprintf(table, sizeof(table), "0 %llu ckpt %s%s%s", (unsigned long long)ck_sectors(m),
		 backing, opts && *opts ? " " : "", opts ? opts : "");
	return ck_create(name, table);
}

int ck_dm_message(const char *name, const char *msg)
{
	static union {
		struct dm_ioctl io;
		char buf[16384];
	} u;
	struct dm_target_msg *tm;
	int fd, r;

	memset(&u, 0, sizeof(u));
	u.io.version[0] = DM_VERSION_MAJOR;
	u.io.data_size = sizeof(u);
	u.io.data_start = sizeof(u.io);
	snprintf(u.io.name, sizeof(u.io.name), "%s", name);
	tm = (struct dm_target_msg *)(u.buf + u.io.data_start);
	tm->sector = 0;
	snprintf(tm->message, sizeof(u) - u.io.data_start - sizeof(*tm), "%s", msg);
	fd = open("/dev/mapper/control", O_RDWR);
	if (fd < 0)
		return -errno;
	r = ioctl(fd, DM_TARGET_MSG, &u.io) ? -errno : 0;
	close(fd);
	return r;
}

int ck_open_dm(const char *name)
{
	char path[256];

	snprintf(path, sizeof(path), "/dev/mapper/%s", name);
	return open(path, O_RDWR | O_DIRECT);
}

int ck_send(int fd, const struct ckpt_cmd *cmd)
{
	uint8_t *b = ck_alloc(CKPT_BLOCK);
	int len, r;

	if (!b)
		return -ENOMEM;
	len = ckpt_cmd_encode(cmd, b);
	if (len < 0) {
		free(b);
		return -EINVAL;
	}
	r = ck_pwrite(fd, b, ((size_t)len + 511) / 512 * 512, 0);
	free(b);
	return r;
}

int ck_begin(int fd, uint64_t t, uint32_t grad_scale,
			      const struct ckpt_hparams *hp, uint32_t n_groups)
{
	struct ckpt_cmd *cmd = calloc(1, sizeof(*cmd));
	int r;

	cmd->opcode = CKPT_OP_BEGIN;
	cmd->step = t;
	cmd->grad_scale = grad_scale;
	cmd->n_groups = n_groups;
	memcpy(cmd->groups, hp, n_groups * sizeof(*hp));
	r = ck_send(fd, cmd);
	free(cmd);
	return r;
}

int ck_commit(int fd, uint64_t t, const void *blob, uint32_t blob_len)
{
	struct ckpt_cmd *cmd = calloc(1, sizeof(*cmd));
	int r;

	cmd->opcode = CKPT_OP_COMMIT;
	cmd->step = t;
	cmd->blob_len = blob_len;
	if (blob_len)
		memcpy(cmd->blob, blob, blob_len);
	r = ck_send(fd, cmd);
	free(cmd);
	return r;
}

/* A command with no payload but its step (ABORT, ROLLBACK). */
static int ck_send_step(int fd, uint32_t opcode, uint64_t t)
{
	struct ckpt_cmd *cmd = calloc(1, sizeof(*cmd));
	int r;

	cmd->opcode = opcode;
	cmd->step = t;
	r = ck_send(fd, cmd);
	free(cmd);
	return r;
}

int ck_abort(int fd, uint64_t t)
{
	return ck_send_step(fd, CKPT_OP_ABORT, t);
}

int ck_rollback(int fd, uint64_t t)
{
	return ck_send_step(fd, CKPT_OP_ROLLBACK, t);
}

int ck_status(int fd, struct ckpt_status *st)
{
	uint8_t *b = ck_alloc(CKPT_BLOCK);
	int r;

	if (!b)
		return -ENOMEM;
	r = ck_pread(fd, b, CKPT_BLOCK, 0);
	if (!r)
		r = ckpt_status_decode(b, st);
	free(b);
	return r;
}

int ck_grad(int fd, const struct ck_model *m, const uint16_t *grad,
			     uint64_t off, uint64_t len)
{
	return ck_write_at(fd, (const uint8_t *)grad + off, len, m->l.grad_off + off);
}

int ck_params(int fd, const struct ck_model *m, void *out, uint64_t off,
			       uint64_t len)
{
	return ck_read_at(fd, out, len, m->l.param_off + off);
}

long ck_dm_events(const char *name)
{
	char out[2048], *p;

	if (ck_sh(out, sizeof(out), "dmsetup info %s 2>&1", name))
		return -1;
	p = strstr(out, "Event number:");
	return p ? strtol(p + strlen("Event number:"), NULL, 10) : -1;
}

int ck_dm_wait(const char *name, uint32_t event_nr, unsigned int timeout_s)
{
	pid_t pid = fork();
	int st;

	if (pid < 0)
		return -errno;
	if (!pid) {
		struct dm_ioctl io;
		int fd = open("/dev/mapper/control", O_RDWR);

		memset(&io, 0, sizeof(io));
		io.version[0] = DM_VERSION_MAJOR;
		io.data_size = sizeof(io);
		io.data_start = sizeof(io);
		io.event_nr = event_nr;
		snprintf(io.name, sizeof(io.name), "%s", name);
		alarm(timeout_s);
		_exit(fd >= 0 && !ioctl(fd, DM_DEV_WAIT, &io) ? 0 : 1);
	}
	if (waitpid(pid, &st, 0) < 0)
		return -errno;
	if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
		return -ETIMEDOUT;
	return WIFEXITED(st) && !WEXITSTATUS(st) ? 0 : -EIO;
}

int ck_dm_swap(const char *name, const char *table, char *out, size_t n)
{
	/* a file, so that a table may have several lines */
	FILE *f = fopen("/tmp/ck_table", "w");

	if (!f || fputs(table, f) < 0 || fclose(f))
		return -1;
	if (ck_sh(out, n, "dmsetup suspend --noudevsync %s 2>&1", name) ||
	    ck_sh(out, n, "dmsetup load --noudevsync %s /tmp/ck_table 2>&1", name) ||
	    ck_sh(out, n, "dmsetup resume --noudevsync %s 2>&1", name))
		return -1;
	return 0;
}

int ck_dm_has_target(const char *type)
{
	char out[4096], want[64];

	snprintf(want, sizeof(want), "\n%s ", type);
	if (ck_sh(out + 1, sizeof(out) - 1, "dmsetup targets 2>&1"))
		return 0;
	out[0] = '\n';
	return strstr(out, want) != NULL;
}
