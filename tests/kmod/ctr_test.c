// SPDX-License-Identifier: GPL-2.0 OR MIT
// vm: cpu-independent
/*
 * dm-ckpt constructor: every malformed table line and every corrupt
 * superblock must make `dmsetup create` fail cleanly, with the specific
 * ti->error in the kernel log and no kernel bug; good ones must work and
 * round-trip through `dmsetup table`.
 *
 * Corrupt superblocks carry a correct checksum (except the checksum case), so
 * the constructor's own validation is what refuses them. They go to copy 0
 * with copy 1 zeroed, so the error reported is theirs.
 */
#include "ckpt_kmod.h"
#include "kselftest_harness.h"

FIXTURE(ctr) {
	struct ck_model m;
	char devno[32];
};

FIXTURE_SETUP(ctr)
{
	struct ckpt_geometry g = ck_geo(8, 11, 2, CKPT_DTYPE_BF16);

	ck_remove(CK_NAME);
	ASSERT_EQ(0, ck_format(&self->m, ck_dev(), &g, 7));
	ck_devno(ck_dev(), self->devno, sizeof(self->devno));
	ck_kmsg_clear();
}

FIXTURE_TEARDOWN(ctr)
{
	ck_remove(CK_NAME);
	EXPECT_EQ(0, ck_kmsg_bug());
	ck_model_free(&self->m);
}

/* create must fail, and the kernel log must say why. */
static int expect_refused(struct __test_metadata *_metadata, const char *table,
			  const char *error)
{
	char out[4096];
	int ok;

	ck_kmsg_clear();
	ok = ck_create(CK_NAME, table) == 0;
	if (ok) {
		ck_remove(CK_NAME);
		TH_LOG("table '%s' was accepted", table);
		return -1;
	}
	if (!ck_kmsg_has(error)) {
		char *log = ck_kmsg();

		TH_LOG("table '%s': no '%s' in the kernel log:\n%s", table, error,
		       log ? log : "");
		free(log);
		return -1;
	}
	if (ck_kmsg_bug()) {
		TH_LOG("table '%s': kernel bug", table);
		return -1;
	}
	ck_sh(out, sizeof(out), "dmsetup info %s 2>&1", CK_NAME);
	if (!strstr(out, "not exist") && !strstr(out, "No such")) {
		/* a failed create must leave no device behind */
		TH_LOG("after a failed create: %s", out);
		ck_remove(CK_NAME);
		return -1;
	}
	return 0;
}

TEST_F(ctr, good_table_round_trips)
{
	char table[512], out[1024];
	unsigned long long n = ck_sectors(&self->m);

	snprintf(table, sizeof(table), "0 %llu ckpt %s", n, ck_dev());
	ASSERT_EQ(0, ck_create(CK_NAME, table));
	ASSERT_EQ(0, ck_sh(out, sizeof(out), "dmsetup table %s", CK_NAME));
	snprintf(table, sizeof(table), "0 %llu ckpt %s\n", n, self->devno);
	EXPECT_STREQ(table, out);
	ck_remove(CK_NAME);

	snprintf(table, sizeof(table), "0 %llu ckpt %s 4 staging_kb 64 queue_depth 3", n,
		 ck_dev());
	ASSERT_EQ(0, ck_create(CK_NAME, table));
	ASSERT_EQ(0, ck_sh(out, sizeof(out), "dmsetup table %s", CK_NAME));
	snprintf(table, sizeof(table), "0 %llu ckpt %s 4 staging_kb 64 queue_depth 3\n", n,
		 self->devno);
	EXPECT_STREQ(table, out);
	ck_remove(CK_NAME);

	snprintf(table, sizeof(table), "0 %llu ckpt %s 2 queue_depth 1", n, ck_dev());
	ASSERT_EQ(0, ck_create(CK_NAME, table));
	ASSERT_EQ(0, ck_sh(out, sizeof(out), "dmsetup table %s", CK_NAME));
	snprintf(table, sizeof(table), "0 %llu ckpt %s 2 queue_depth 1\n", n, self->devno);
	EXPECT_STREQ(table, out);
	/* the INFO status line: state, committed, open, chunks, ... */
	ASSERT_EQ(0, ck_sh(out, sizeof(out), "dmsetup status %s", CK_NAME));
	snprintf(table, sizeof(table), "0 %llu ckpt idle 0 0 0/8 0 none 0 0 0 0 0 0 0 0 0\n", n);
	EXPECT_STREQ(table, out);
}

TEST_F(ctr, bad_table_lines)
{
	static const struct {
		const char *args;	/* after "ckpt" ("%s" is the device) */
		const char *error;
	} cases[] = {
		{ "", "Invalid argument count" },
		{ "/dev/ckpt-no-such-device", "Backing device lookup failed" },
		{ "%s x", "Invalid number of optional arguments" },
		{ "%s -2 queue_depth 2", "Invalid number of optional arguments" },
		{ "%s 6 queue_depth 2 staging_kb 8 queue_depth 2",
		  "Invalid number of optional arguments" },
		{ "%s 2 queue_depth", "Invalid number of optional arguments" },
		{ "%s 1 queue_depth", "queue_depth needs a value" },
		{ "%s 1 staging_kb", "staging_kb needs a value" },
		{ "%s 2 queue_depth 0", "queue_depth out of range" },
		{ "%s 2 queue_depth 129", "queue_depth out of range" },
		{ "%s 2 queue_depth abc", "Invalid queue_depth" },
		{ "%s 2 queue_depth -1", "Invalid queue_depth" },
		{ "%s 2 queue_depth 99999999999", "Invalid queue_depth" },
		{ "%s 2 staging_kb 0", "staging_kb out of range" },
		{ "%s 2 staging_kb 4194305", "staging_kb out of range" },
		{ "%s 2 staging_kb 1k", "Invalid staging_kb" },
		{ "%s 2 stagingkb 8", "Unknown optional argument" },
		{ "%s 4 queue_depth 2 queue_depth 3", "Duplicate queue_depth" },
		{ "%s 4 staging_kb 8 staging_kb 8", "Duplicate staging_kb" },
		{ "%s 2 queue_depth 2 extra", "Too many arguments" },
		{ "%s 0 extra", "Too many arguments" },
	};
	unsigned long long n = ck_sectors(&self->m);
	char args[256], table[512];
	size_t i;
	int bad = 0;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(args, sizeof(args), cases[i].args, ck_dev());
		snprintf(table, sizeof(table), "0 %llu ckpt%s%s", n, *args ? " " : "", args);
		bad |= expect_refused(_metadata, table, cases[i].error);
	}
	/* the length must be the device's virtual size, exactly */
	snprintf(table, sizeof(table), "0 %llu ckpt %s", n - 8, ck_dev());
	bad |= expect_refused(_metadata, table, "Target length does not match the virtual size");
	snprintf(table, sizeof(table), "0 %llu ckpt %s", n + 8, ck_dev());
	bad |= expect_refused(_metadata, table, "Target length does not match the virtual size");
	snprintf(table, sizeof(table), "0 %llu ckpt %s", n - 1, ck_dev());
	bad |= expect_refused(_metadata, table, "Target length does not match the virtual size");
	EXPECT_EQ(0, bad);
}

/* ------------------------------------------------------------ superblocks */

enum sb_field {
	F_MAGIC, F_CRC, F_VERSION, F_HEADER_BYTES, F_INCOMPAT, F_RO_COMPAT,
	F_N_CHUNKS, F_CHUNK_SHIFT, F_N_GROUPS, F_DTYPE, F_OPTIMIZER, F_MANIFEST_BYTES,
	F_GROUP_OFF, F_MANIFEST_OFF, F_PLO0, F_PLO1, F_REC0, F_REC1, F_RECORD_BYTES,
	F_DEV_BYTES, F_SLOT, F_BLOB_LEN, F_MANIFEST_LEN, F_SEQUENCE, F_NONE,
};

struct sb_case {
	const char *name;
	enum sb_field field;
	uint64_t value;		/* set the field to this (F_DEV_BYTES: delta, see below) */
	int delta;		/* add value to the field instead of setting it */
	const char *error;
};

static void sb_set(struct ckpt_sb_disk *d, const struct sb_case *k)
{
#define SET32(f) (d->f = k->delta ? d->f + (uint32_t)k->value : (uint32_t)k->value)
#define SET64(f) (d->f = k->delta ? d->f + k->value : k->value)
	switch (k->field) {
	case F_MAGIC: SET32(magic); break;
	case F_CRC: break;
	case F_VERSION: SET32(version); break;
	case F_HEADER_BYTES: SET32(header_bytes); break;
	case F_INCOMPAT: SET32(feature_incompat); break;
	case F_RO_COMPAT: SET32(feature_ro_compat); break;
	case F_N_CHUNKS: SET32(n_chunks); break;
	case F_CHUNK_SHIFT: SET32(chunk_shift); break;
	case F_N_GROUPS: SET32(n_groups); break;
	case F_DTYPE: SET32(dtype); break;
	case F_OPTIMIZER: SET32(optimizer); break;
	case F_MANIFEST_BYTES: SET32(manifest_bytes); break;
	case F_GROUP_OFF: SET64(group_off); break;
	case F_MANIFEST_OFF: SET64(manifest_off); break;
	case F_PLO0: SET64(plo_off[0]); break;
	case F_PLO1: SET64(plo_off[1]); break;
	case F_REC0: SET64(rec_off[0]); break;
	case F_REC1: SET64(rec_off[1]); break;
	case F_RECORD_BYTES: SET64(record_bytes); break;
	case F_DEV_BYTES: SET64(dev_bytes); break;
	case F_SLOT: SET32(committed_slot); break;
	case F_BLOB_LEN: SET32(blob_len); break;
	case F_MANIFEST_LEN: SET32(manifest_len); break;
	case F_SEQUENCE: SET64(sequence); break;
	case F_NONE: break;
	}
#undef SET32
#undef SET64
}

static void sb_fix_crc(uint8_t *block)
{
	struct ckpt_sb_disk *d = (struct ckpt_sb_disk *)block;

	d->crc32c = 0;
	d->crc32c = ckpt_crc32c(block, CKPT_BLOCK);
}

/* Copy 0 := the good superblock at sequence 2 with one defect; copy 1 := zeros. */
static int write_bad_sb(const struct ck_model *m, const struct sb_case *k, uint64_t dev_bytes)
{
	uint8_t *blk = ck_alloc(2 * CKPT_BLOCK);
	struct ckpt_sb sb = m->sb;
	int r;

	sb.sequence = 2;
	r = ckpt_sb_encode(&sb, blk);
	if (!r) {
		struct sb_case kk = *k;

		if (k->field == F_DEV_BYTES && k->value == ~0ull)
			kk.value = dev_bytes + CKPT_BLOCK;	/* beyond the device */
		sb_set((struct ckpt_sb_disk *)blk, &kk);
		if (k->field != F_CRC)
			sb_fix_crc(blk);
		else
			((struct ckpt_sb_disk *)blk)->crc32c ^= 1;
		r = ck_write_dev(m->dev, blk, 2 * CKPT_BLOCK, 0);
	}
	free(blk);
	return r;
}

TEST_F_TIMEOUT(ctr, corrupt_superblocks, 300)
{
	static const char *const geo = "Superblock: geometry out of range";
	static const char *const lay = "Superblock: offsets or sizes disagree with the geometry";
	static const char *const small = "Superblock: backing device smaller than the layout";
	static const struct sb_case cases[] = {
		{ "magic", F_MAGIC, 0x12345678, 0, "Superblock: bad magic number" },
		{ "crc", F_CRC, 0, 0, "Superblock: checksum mismatch" },
		{ "version", F_VERSION, 2, 0, "Superblock: unsupported format version" },
		{ "version 0", F_VERSION, 0, 0, "Superblock: unsupported format version" },
		{ "header_bytes", F_HEADER_BYTES, 100, 0, "Superblock: unsupported format version" },
		{ "incompat", F_INCOMPAT, 0x80000000u, 0, "Superblock: unsupported feature bits" },
		{ "ro_compat", F_RO_COMPAT, 0x80000000u, 0, "Superblock: unsupported feature bits" },
		/* bf16 masters exist only with 8-bit moments (and bf16 params) */
		{ "BF16M without Q8", F_INCOMPAT,
		  CKPT_FEATURE_INCOMPAT_DEFAULT | CKPT_FEATURE_INCOMPAT_BF16M, 0,
		  "Superblock: unsupported feature bits" },
		{ "n_chunks 0", F_N_CHUNKS, 0, 0, geo },
		{ "n_chunks max+1", F_N_CHUNKS, (1u << 24) + 1, 0, geo },
		{ "n_chunks 2^32-1", F_N_CHUNKS, 0xffffffffu, 0, geo },
		{ "chunk_shift 10", F_CHUNK_SHIFT, 10, 0, geo },
		{ "chunk_shift 23", F_CHUNK_SHIFT, 23, 0, geo },
		{ "chunk_shift huge", F_CHUNK_SHIFT, 0x80000000u, 0, geo },
		{ "n_groups 0", F_N_GROUPS, 0, 0, geo },
		{ "n_groups 65", F_N_GROUPS, 65, 0, geo },
		{ "dtype 0", F_DTYPE, 0, 0, geo },
		{ "dtype 3", F_DTYPE, 3, 0, geo },
		{ "optimizer 0", F_OPTIMIZER, 0, 0, geo },
		{ "optimizer 2", F_OPTIMIZER, 2, 0, geo },
		{ "manifest_bytes unaligned", F_MANIFEST_BYTES, 4097, 0, geo },
		{ "manifest_bytes too big", F_MANIFEST_BYTES, (64u << 20) + 4096, 0, geo },
		/* geometry fields that are in range but disagree with the offsets */
		{ "n_chunks 7", F_N_CHUNKS, 7, 0, lay },
		{ "chunk_shift 12", F_CHUNK_SHIFT, 12, 0, lay },
		{ "manifest_bytes 8192", F_MANIFEST_BYTES, 8192, 0, lay },
		{ "group_off", F_GROUP_OFF, 4096, 1, lay },
		{ "group_off 0", F_GROUP_OFF, 0, 0, lay },
		{ "manifest_off", F_MANIFEST_OFF, 4096, 1, lay },
		{ "manifest_off -4096", F_MANIFEST_OFF, (uint64_t)-4096, 1, lay },
		{ "plo_off[0]", F_PLO0, 4096, 1, lay },
		{ "plo_off[0] 2^64-1", F_PLO0, ~0ull, 0, lay },
		{ "plo_off[1]", F_PLO1, 512, 1, lay },
		{ "plo_off[1] 0", F_PLO1, 0, 0, lay },
		{ "rec_off[0]", F_REC0, 4096, 1, lay },
		{ "rec_off[1]", F_REC1, (uint64_t)-4096, 1, lay },
		{ "rec_off[1] huge", F_REC1, 1ull << 62, 0, lay },
		{ "record_bytes", F_RECORD_BYTES, 4096, 1, lay },
		{ "record_bytes 0", F_RECORD_BYTES, 0, 0, lay },
		{ "committed_slot 2", F_SLOT, 2, 0, lay },
		{ "committed_slot 2^32-1", F_SLOT, 0xffffffffu, 0, lay },
		{ "dev_bytes below the layout", F_DEV_BYTES, (uint64_t)-4096, 1, small },
		{ "dev_bytes 0", F_DEV_BYTES, 0, 0, small },
		{ "dev_bytes beyond the device", F_DEV_BYTES, ~0ull, 0, small },
		{ "blob_len", F_BLOB_LEN, CKPT_BLOB_MAX + 1, 0, "Superblock: trainer blob too large" },
		{ "blob_len huge", F_BLOB_LEN, 0xffffffffu, 0, "Superblock: trainer blob too large" },
		{ "manifest_len", F_MANIFEST_LEN, CKPT_BLOCK + 1, 0,
		  "Superblock: manifest length out of range" },
		/* copy 0 holds only even sequences */
		{ "odd sequence in copy 0", F_SEQUENCE, 3, 0, "Superblock: no valid copy" },
	};
	uint64_t dev_bytes = ck_dev_bytes(ck_dev());
	unsigned long long n = ck_sectors(&self->m);
	char table[512];
	size_t i;
	int bad = 0;

	snprintf(table, sizeof(table), "0 %llu ckpt %s", n, ck_dev());
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		ASSERT_EQ(0, write_bad_sb(&self->m, &cases[i], dev_bytes));
		if (expect_refused(_metadata, table, cases[i].error)) {
			TH_LOG("case: %s", cases[i].name);
			bad = 1;
		}
	}
	EXPECT_EQ(0, bad);
}

/* A geometry whose consistent layout is larger than the device. */
TEST_F(ctr, device_too_small)
{
	uint8_t *blk = ck_alloc(2 * CKPT_BLOCK);
	uint64_t dev_bytes = ck_dev_bytes(ck_dev());
	struct ckpt_sb sb = self->m.sb;
	char table[512];
	int fd;

	sb.geo.n_chunks = (uint32_t)(dev_bytes / (14u << 16)) + 1;
	sb.geo.chunk_shift = 16;
	ASSERT_EQ(0, ckpt_regions_compute(&sb.geo, &sb.regions));
	ASSERT_GT(sb.regions.dev_bytes, dev_bytes);
	sb.sequence = 2;
	ASSERT_EQ(0, ckpt_sb_encode(&sb, blk));
	fd = open(ck_dev(), O_RDWR | O_DIRECT);
	ASSERT_EQ(0, ck_write_at(fd, blk, 2 * CKPT_BLOCK, 0));
	close(fd);
	snprintf(table, sizeof(table), "0 %llu ckpt %s",
		 (unsigned long long)(sb.regions.virt_bytes / 512), ck_dev());
	EXPECT_EQ(0, expect_refused(_metadata, table,
				    "Superblock: backing device smaller than the layout"));
	free(blk);
}

TEST_F(ctr, no_superblock)
{
	uint8_t *blk = ck_alloc(2 * CKPT_BLOCK);
	char table[512];

	ASSERT_EQ(0, ck_write_dev(ck_dev(), blk, 2 * CKPT_BLOCK, 0));
	snprintf(table, sizeof(table), "0 %llu ckpt %s", (unsigned long long)ck_sectors(&self->m),
		 ck_dev());
	EXPECT_EQ(0, expect_refused(_metadata, table, "Superblock: bad magic number"));
	free(blk);
}

TEST_F(ctr, group_table_out_of_range)
{
	uint8_t *blk = ck_alloc(CKPT_BLOCK);
	char table[512];
	int fd = open(ck_dev(), O_RDWR | O_DIRECT);

	ASSERT_EQ(0, ck_read_at(fd, blk, CKPT_BLOCK, self->m.l.group_off));
	blk[5] = 2;	/* the device has groups 0 and 1 */
	ASSERT_EQ(0, ck_write_at(fd, blk, CKPT_BLOCK, self->m.l.group_off));
	close(fd);
	snprintf(table, sizeof(table), "0 %llu ckpt %s", (unsigned long long)ck_sectors(&self->m),
		 ck_dev());
	EXPECT_EQ(0, expect_refused(_metadata, table, "Group table: a chunk's group is out of range"));
	free(blk);
}

/* The newer valid copy wins; a corrupt newer copy falls back to the older. */
TEST_F(ctr, picks_the_newest_valid_copy)
{
	uint8_t *blk = ck_alloc(2 * CKPT_BLOCK);
	struct ckpt_sb sb = self->m.sb;
	struct ckpt_status st;
	char table[512];
	int fd;

	/* copy 1: sequence 1, step 0 (formatted); copy 0: sequence 2, step 0, blob "new" */
	sb.sequence = 2;
	sb.blob_len = 3;
	memcpy(sb.blob, "new", 3);
	ASSERT_EQ(0, ckpt_sb_encode(&sb, blk));
	fd = open(ck_dev(), O_RDWR | O_DIRECT);
	ASSERT_EQ(0, ck_write_at(fd, blk, CKPT_BLOCK, 0));
	close(fd);
	snprintf(table, sizeof(table), "0 %llu ckpt %s", (unsigned long long)ck_sectors(&self->m),
		 ck_dev());
	ASSERT_EQ(0, ck_create(CK_NAME, table));
	fd = ck_open_dm(CK_NAME);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, ck_status(fd, &st));
	EXPECT_EQ(3, st.blob_len);
	EXPECT_EQ(0, memcmp(st.blob, "new", 3));
	close(fd);
	ck_remove(CK_NAME);

	/* corrupt copy 0 (bad crc): copy 1 is used, no blob */
	blk[100] ^= 0xff;
	fd = open(ck_dev(), O_RDWR | O_DIRECT);
	ASSERT_EQ(0, ck_write_at(fd, blk, CKPT_BLOCK, 0));
	close(fd);
	ASSERT_EQ(0, ck_create(CK_NAME, table));
	fd = ck_open_dm(CK_NAME);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, ck_status(fd, &st));
	EXPECT_EQ(0, st.blob_len);
	EXPECT_EQ(CKPT_STATE_IDLE, st.state);
	close(fd);
	free(blk);
}

/*
 * Turn the fixture's image into a META2 one: the layout grows a second group
 * table (and manifest, empty here) after the last record slot, and the
 * superblock (copy 1, sequence 1) carries the group table's crc32c.
 */
static int make_meta2(struct ck_model *m)
{
	uint8_t *blk = ck_alloc(CKPT_BLOCK);
	struct ckpt_regions l;
	int fd, ret = -1;

	if (!blk ||
	    ckpt_regions_compute_features(&m->sb.geo,
					 m->sb.feature_incompat | CKPT_FEATURE_INCOMPAT_META2, &l) ||
	    l.group_bytes != CKPT_BLOCK || ck_dev_bytes(m->dev) < l.dev_bytes)
		goto out;
	m->l = l;
	m->sb.regions = l;
	m->sb.feature_incompat |= CKPT_FEATURE_INCOMPAT_META2;
	m->sb.group_crc = ckpt_crc32c(m->groups, m->sb.geo.n_chunks);
	fd = open(m->dev, O_RDWR | O_DIRECT);
	if (fd < 0)
		goto out;
	memcpy(blk, m->groups, m->sb.geo.n_chunks);
	ret = ck_write_at(fd, blk, CKPT_BLOCK, l.meta2_off);
	if (!ret)
		ret = ckpt_sb_encode(&m->sb, blk) ? -1 : ck_write_at(fd, blk, CKPT_BLOCK, CKPT_BLOCK);
	close(fd);
out:
	free(blk);
	return ret;
}

/* Set chunk's group in copy k of the group table, behind the superblock's back. */
static int poke_group(const struct ck_model *m, uint32_t k, uint32_t chunk, uint8_t group)
{
	uint8_t *blk = ck_alloc(CKPT_BLOCK);
	uint64_t off = ckpt_group_offset(&m->l, k);
	int fd = open(m->dev, O_RDWR | O_DIRECT), ret = -1;

	if (fd >= 0 && blk && !ck_read_at(fd, blk, CKPT_BLOCK, off)) {
		blk[chunk] = group;
		ret = ck_write_at(fd, blk, CKPT_BLOCK, off);
	}
	if (fd >= 0)
		close(fd);
	free(blk);
	return ret;
}

/*
 * META2: a flipped group byte (still a valid group) in copy 0 fails the
 * group table checksum; the target uses copy 1, says so, and updates every
 * chunk with its own group's hyperparameters. With both copies damaged the
 * constructor refuses.
 */
TEST_F(ctr, group_table_checksum_falls_back_to_copy)
{
	struct ck_model *m = &self->m;
	struct ckpt_hparams hp[2];
	uint16_t *grad = NULL;
	char table[512], why[256];
	uint64_t i;
	int fd;

	ASSERT_EQ(0, make_meta2(m));
	ASSERT_EQ(1, m->groups[5]);
	ASSERT_EQ(0, poke_group(m, 0, 5, 0));
	snprintf(table, sizeof(table), "0 %llu ckpt %s", (unsigned long long)ck_sectors(m), ck_dev());
	ck_kmsg_clear();
	ASSERT_EQ(0, ck_create(CK_NAME, table));
	EXPECT_TRUE(ck_kmsg_has("group table copy 0"));
	EXPECT_TRUE(ck_kmsg_has("is damaged (checksum mismatch): using copy 1"));

	/* group 1 moves 1000 times further than group 0: a wrong group shows */
	hp[0] = ck_hparams(1e-4, 0.9, 0.999, 1e-8, 0.0, 0, 1);
	hp[1] = ck_hparams(1e-1, 0.9, 0.999, 1e-8, 0.0, 0, 1);
	grad = ck_alloc(m->l.window_bytes);
	ASSERT_NE(NULL, grad);
	for (i = 0; i < m->l.n_params; i++)
		grad[i] = (uint16_t)(i & 1 ? 0x3f80 : 0xbf80);	/* bf16 +-1 */
	fd = ck_open_dm(CK_NAME);
	ASSERT_LE(0, fd);
	ASSERT_EQ(0, ck_begin(fd, 1, ck_f32(1.0), hp, 2));
	ck_model_step(m, 1, hp, ck_f32(1.0), grad, NULL);
	ASSERT_EQ(0, ck_grad(fd, m, grad, 0, m->l.window_bytes));
	ASSERT_EQ(0, ck_commit(fd, 1, NULL, 0));
	close(fd);
	ck_remove(CK_NAME);
	ck_model_commit(m, 1, NULL, 0);
	EXPECT_EQ(0, ck_model_verify(m, why, sizeof(why)));
	if (ck_model_verify(m, why, sizeof(why)))
		TH_LOG("backing device: %s", why);
	free(grad);

	ASSERT_EQ(0, poke_group(m, 1, 2, 1));
	snprintf(table, sizeof(table), "0 %llu ckpt %s", (unsigned long long)ck_sectors(m), ck_dev());
	EXPECT_EQ(0, expect_refused(_metadata, table, "Group table: no intact copy"));
}

/* A damaged superblock copy next to the one in use is logged, not ignored. */
TEST_F(ctr, damaged_superblock_copy_warns)
{
	uint8_t *blk = ck_alloc(CKPT_BLOCK);
	struct ckpt_sb sb = self->m.sb;
	char table[512];

	/* copy 0: a sequence 2 commit with a flipped byte (a lost newer commit) */
	sb.sequence = 2;
	ASSERT_EQ(0, ckpt_sb_encode(&sb, blk));
	blk[200] ^= 0x01;
	ASSERT_EQ(0, ck_write_sb_block(ck_dev(), blk, 0));
	snprintf(table, sizeof(table), "0 %llu ckpt %s", (unsigned long long)ck_sectors(&self->m),
		 ck_dev());
	ck_kmsg_clear();
	ASSERT_EQ(0, ck_create(CK_NAME, table));
	EXPECT_TRUE(ck_kmsg_has("superblock copy 0"));
	EXPECT_TRUE(ck_kmsg_has("is damaged (checksum mismatch): using copy 1 (sequence 1"));
	ck_remove(CK_NAME);

	/* a blank copy 0 (as after format) is no damage */
	memset(blk, 0, CKPT_BLOCK);
	ASSERT_EQ(0, ck_write_sb_block(ck_dev(), blk, 0));
	ck_kmsg_clear();
	ASSERT_EQ(0, ck_create(CK_NAME, table));
	EXPECT_FALSE(ck_kmsg_has("is damaged"));
	free(blk);
}

TEST_HARNESS_MAIN
