// SPDX-License-Identifier: GPL-2.0 OR MIT
// vm: cpu-independent
/*
 * The module's life: it cannot be unloaded while a ckpt device exists, and
 * loading it, creating a device, running a step, removing the device and
 * unloading it again, a hundred times over, leaves no memory behind
 * (Slab + VmallocUsed + Percpu of /proc/meminfo, after dropping caches).
 *
 * The module file is the one the VM's /init loaded (listed in /ckpt/modules),
 * or $CKPT_TEST_MODULE.
 */
#include "ckpt_kmod.h"
#include "kselftest_harness.h"

#define CYCLES 100
#define WARMUP 5
#define LEAK_LIMIT_KB 1024

static int module_path(char *out, size_t n)
{
	const char *env = getenv("CKPT_TEST_MODULE");
	char *nl;

	if (env && *env) {
		snprintf(out, n, "%s", env);
		return 0;
	}
	if (ck_sh(out, n, "awk '$2 ~ /dm-ckpt\\.ko$/ { print $2 }' /ckpt/modules 2>/dev/null") ||
	    !*out)
		return -1;
	nl = strchr(out, '\n');
	if (nl)
		*nl = 0;
	return access(out, R_OK) ? -1 : 0;
}

static long meminfo_kb(const char *field)
{
	char cmd[128], out[64] = "";

	snprintf(cmd, sizeof(cmd), "awk '$1 == \"%s:\" { print $2 }' /proc/meminfo", field);
	ck_sh(out, sizeof(out), "%s", cmd);
	return strtol(out, NULL, 10);
}

static long kernel_kb(void)
{
	ck_sh(NULL, 0, "sync; echo 3 > /proc/sys/vm/drop_caches");
	return meminfo_kb("Slab") + meminfo_kb("VmallocUsed") + meminfo_kb("Percpu");
}

static int loaded(void)
{
	return ck_sh(NULL, 0, "grep -q '^dm_ckpt ' /proc/modules") == 0;
}

/* One step through the device: 0 or -1. */
static int one_step(struct ck_model *m, uint64_t t, uint16_t *grad)
{
	struct ckpt_hparams hp = ck_hparams(1e-3, 0.9, 0.999, 1e-8, 0.01, 0, t);
	int fd = ck_open_dm(CK_NAME), ret;

	if (fd < 0)
		return -1;
	ret = ck_begin(fd, t, ck_f32(1.0), &hp, 1);
	if (!ret)
		ret = ck_grad(fd, m, grad, 0, m->l.n_params * 2);
	if (!ret)
		ret = ck_commit(fd, t, NULL, 0);
	if (!ret) {
		ck_model_step(m, t, &hp, ck_f32(1.0), grad, NULL);
		ck_model_commit(m, t, NULL, 0);
	}
	close(fd);
	return ret ? -1 : 0;
}

FIXTURE(life) {
	struct ck_model m;
	char ko[512];
	uint16_t *grad;
};

FIXTURE_SETUP(life)
{
	struct ckpt_geometry g = ck_geo(4, 11, 1, CKPT_DTYPE_FP16);
	uint64_t i;

	ck_remove(CK_NAME);
	ASSERT_EQ(0, module_path(self->ko, sizeof(self->ko)));
	ASSERT_EQ(0, ck_format(&self->m, ck_dev(), &g, 13));
	self->grad = calloc(self->m.l.n_params, 2);
	ASSERT_NE(NULL, self->grad);
	for (i = 0; i < self->m.l.n_params; i++)
		self->grad[i] = (uint16_t)(0x1000 + (i * 7919) % 0x2000);	/* small fp16 */
	if (!loaded())
		ASSERT_EQ(0, ck_sh(NULL, 0, "insmod %s 2>&1", self->ko));
	ck_kmsg_clear();
}

FIXTURE_TEARDOWN(life)
{
	ck_remove(CK_NAME);
	if (!loaded())
		ck_sh(NULL, 0, "insmod %s 2>&1", self->ko);
	EXPECT_EQ(0, ck_kmsg_bug());
	free(self->grad);
	ck_model_free(&self->m);
}

TEST_F(life, unload_with_a_live_device_is_refused)
{
	char out[1024];

	ASSERT_EQ(0, ck_create_ckpt(&self->m, CK_NAME, ck_dev(), NULL));
	EXPECT_NE(0, ck_sh(out, sizeof(out), "rmmod dm_ckpt 2>&1"));
	EXPECT_EQ(1, loaded());
	EXPECT_EQ(0, one_step(&self->m, 1, self->grad));
	ck_remove(CK_NAME);
	EXPECT_EQ(0, ck_sh(out, sizeof(out), "rmmod dm_ckpt 2>&1")) TH_LOG("%s", out);
	EXPECT_EQ(0, loaded());
}

TEST_F_TIMEOUT(life, load_create_remove_unload_cycles_leak_nothing, 900)
{
	char out[1024], why[256];
	long before = 0, after;
	int i;

	ASSERT_EQ(0, ck_sh(out, sizeof(out), "rmmod dm_ckpt 2>&1")) TH_LOG("%s", out);
	for (i = 0; i < WARMUP + CYCLES; i++) {
		if (i == WARMUP)
			before = kernel_kb();
		ASSERT_EQ(0, ck_sh(out, sizeof(out), "insmod %s 2>&1", self->ko))
			TH_LOG("cycle %d: insmod: %s", i, out);
		ASSERT_EQ(0, ck_create_ckpt(&self->m, CK_NAME, ck_dev(), NULL))
			TH_LOG("cycle %d: create", i);
		ASSERT_EQ(0, one_step(&self->m, self->m.sb.committed_step + 1, self->grad))
			TH_LOG("cycle %d: step", i);
		ck_remove(CK_NAME);
		ASSERT_EQ(0, ck_sh(out, sizeof(out), "rmmod dm_ckpt 2>&1"))
			TH_LOG("cycle %d: rmmod: %s", i, out);
	}
	after = kernel_kb();
	TH_LOG("Slab+VmallocUsed+Percpu: %ld kB before, %ld kB after %d cycles", before, after,
	       CYCLES);
	EXPECT_GT(LEAK_LIMIT_KB, after - before);
	EXPECT_EQ(0, ck_model_verify(&self->m, why, sizeof(why))) TH_LOG("%s", why);
}

TEST_HARNESS_MAIN
