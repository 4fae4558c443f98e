// SPDX-License-Identifier: MIT
// The C ABI: exceptions stop here and become a code plus a thread-local message.
#include "ckpt.h"

#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "device.hpp"
#include "error.hpp"
#include "format.hpp"

struct ckpt_layout_builder {
	ckpt::Layout layout;
};

// No struct ckpt_device is ever made: a device handle is an id into the
// table below, so a closed (or made-up) handle is looked up and refused, never
// dereferenced, and ids are not reused.

namespace {

// One open device. Calls are serialized: Device keeps one command page and a
// step's status read and command must not interleave with another thread's.
struct OpenDevice {
	std::mutex mu;
	std::unique_ptr<ckpt::Device> dev;	// null once closed
	std::vector<std::string> warnings;	// as of ckpt_open
};

class Handles {
public:
	ckpt_device *add(std::unique_ptr<ckpt::Device> dev)
	{
		auto od = std::make_shared<OpenDevice>();
		od->warnings = dev->warnings();
		od->dev = std::move(dev);
		std::lock_guard lock(mu_);
		const uintptr_t id = next_++;
		open_.emplace(id, std::move(od));
		return reinterpret_cast<ckpt_device *>(id);
	}

	// The device of h; a closed one still answers (with CKPT_E_STATE) while
	// a call that found it before ckpt_close holds it.
	std::shared_ptr<OpenDevice> find(ckpt_device *h)
	{
		const auto id = reinterpret_cast<uintptr_t>(h);
		std::lock_guard lock(mu_);
		if (auto it = open_.find(id); it != open_.end())
			return it->second;
		if (id && id < next_)
			ckpt::fail(CKPT_E_STATE, "device is closed");
		ckpt::fail(CKPT_E_INVAL, "{} is not a device handle", static_cast<const void *>(h));
	}

	std::shared_ptr<OpenDevice> remove(ckpt_device *h) noexcept
	{
		std::lock_guard lock(mu_);
		auto it = open_.find(reinterpret_cast<uintptr_t>(h));
		if (it == open_.end())
			return nullptr;
		auto od = std::move(it->second);
		open_.erase(it);
		return od;
	}

private:
	std::mutex mu_;
	uintptr_t next_ = 1;
	std::unordered_map<uintptr_t, std::shared_ptr<OpenDevice>> open_;
};

// Never destroyed: a thread may still call while the process exits.
Handles &handles()
{
	static auto *h = new Handles;
	return *h;
}

thread_local std::string last_error;

template <typename F> int guarded(F &&f)
{
	try {
		return f();
	} catch (const ckpt::Error &e) {
		last_error = e.what();
		return -e.code();
	} catch (const std::bad_alloc &) {
		last_error = "out of memory";
		return -CKPT_E_NOMEM;
	} catch (const std::exception &e) {
		last_error = e.what();
		return -CKPT_E_INVAL;
	}
}

void need(const void *p, const char *what)
{
	if (!p)
		ckpt::fail(CKPT_E_INVAL, "{} is NULL", what);
}

// guarded(f(open device)) with d's open device, as the only call on it.
template <typename F> int with_open(ckpt_device *d, F &&f)
{
	return guarded([&] {
		need(d, "device");
		const auto od = handles().find(d);
		std::lock_guard lock(od->mu);
		if (!od->dev)
			ckpt::fail(CKPT_E_STATE, "device is closed");
		return f(*od);
	});
}

template <typename F> int with_device(ckpt_device *d, F &&f)
{
	return with_open(d, [&](OpenDevice &od) { return f(*od.dev); });
}

} // namespace

extern "C" {

const char *ckpt_last_error(void) { return last_error.c_str(); }

ckpt_layout_builder *ckpt_layout_new(void) { return new (std::nothrow) ckpt_layout_builder; }

void ckpt_layout_free(ckpt_layout_builder *l) { delete l; }

int ckpt_layout_add(ckpt_layout_builder *l, const char *name, const uint64_t *shape, uint32_t ndim,
		    uint32_t group)
{
	return guarded([&] {
		need(l, "layout");
		need(name, "name");
		if (ndim)
			need(shape, "shape");
		l->layout.add(name, std::vector<uint64_t>(shape, shape + ndim), group);
		return 0;
	});
}

int ckpt_format(const char *path, const ckpt_layout_builder *l, int dtype, uint32_t chunk_params,
		uint64_t size)
{
	return guarded([&] {
		need(path, "path");
		need(l, "layout");
		ckpt::FormatOptions opts;
		opts.dtype = static_cast<uint32_t>(dtype);
		opts.chunk_params = chunk_params;
		opts.size = size;
		opts.force = true;	// the ABI formats what it is given, as it always did
		ckpt::format(path, l->layout, opts);
		return 0;
	});
}

int ckpt_open(const char *path, ckpt_device **out)
{
	return guarded([&] {
		need(path, "path");
		need(out, "out");
		*out = handles().add(ckpt::Device::open(path));
		return 0;
	});
}

void ckpt_close(ckpt_device *d)
{
	// new calls now fail; wait for the one in flight, then close
	if (const auto od = handles().remove(d)) {
		std::lock_guard lock(od->mu);
		od->dev.reset();
	}
}

int ckpt_warning(ckpt_device *d, uint32_t index, const char **msg)
{
	return with_open(d, [&](OpenDevice &od) {
		if (msg && index < od.warnings.size())
			*msg = od.warnings[index].c_str();
		return static_cast<int>(od.warnings.size());
	});
}

int ckpt_info(ckpt_device *d, struct ckpt_info *info)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need(info, "info");
		const struct ckpt_status st = dev.status();
		*info = {};
		info->committed_step = st.committed_step;
		info->open_step = st.state == CKPT_STATE_OPEN ? st.open_step : 0;
		info->state = st.state;
		info->dtype = st.geo.dtype;
		info->chunk_params = 1u << st.geo.chunk_shift;
		info->n_chunks = st.geo.n_chunks;
		info->n_params = static_cast<uint64_t>(st.geo.n_chunks) << st.geo.chunk_shift;
		info->n_groups = st.geo.n_groups;
		info->n_tensors = static_cast<uint32_t>(dev.manifest().tensors().size());
		info->steps_committed = st.steps_committed;
		info->steps_skipped = st.steps_skipped;
		return 0;
	});
}

int ckpt_tensor(ckpt_device *d, uint32_t index, struct ckpt_tensor_info *info)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need(info, "info");
		const auto &ts = dev.manifest().tensors();
		if (index >= ts.size())
			ckpt::fail(CKPT_E_RANGE, "tensor index {} out of range ({} tensors)", index, ts.size());
		const ckpt::Tensor &t = ts[index];
		*info = {};
		info->name = t.name.c_str();
		info->ndim = static_cast<uint32_t>(t.shape.size());
		info->group = t.group;
		std::copy(t.shape.begin(), t.shape.end(), info->shape);
		info->numel = t.numel;
		info->offset = t.offset;
		return 0;
	});
}

int ckpt_load_params(ckpt_device *d, const char *name, const float *values, uint64_t n)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need(name, "name");
		need(values, "values");
		dev.load_params({{name, std::span<const float>(values, n)}});
		return 0;
	});
}

int ckpt_load_params_multi(ckpt_device *d, uint32_t count, const char *const *names,
			   const float *const *values, const uint64_t *ns)
{
	return with_device(d, [&](ckpt::Device &dev) {
		if (count) {
			need(names, "names");
			need(values, "values");
			need(ns, "ns");
		}
		std::vector<std::pair<std::string, std::span<const float>>> v;
		for (uint32_t i = 0; i < count; i++) {
			need(names[i], "name");
			need(values[i], "values");
			v.emplace_back(names[i], std::span<const float>(values[i], ns[i]));
		}
		dev.load_params(v);
		return 0;
	});
}

int ckpt_begin(ckpt_device *d, const struct ckpt_group_hparams *groups, uint32_t n_groups,
	       double grad_scale)
{
	return with_device(d, [&](ckpt::Device &dev) {
		// the caller's array has n_groups entries: check the count before
		// reading (or allocating) that many
		const uint32_t want = dev.geometry().n_groups;
		if (n_groups != want)
			ckpt::fail(CKPT_E_GROUPS, "begin: {} hyperparameter groups given, the device has {}",
				   n_groups, want);
		need(groups, "groups");
		std::vector<ckpt::GroupHparams> g(n_groups);
		for (uint32_t i = 0; i < n_groups; i++)
			g[i] = {groups[i].lr, groups[i].beta1, groups[i].beta2, groups[i].eps,
				groups[i].weight_decay, groups[i].adam_l2 != 0};
		dev.begin(g, grad_scale);
		return 0;
	});
}

int ckpt_write_grad(ckpt_device *d, const char *name, const uint16_t *grad, uint64_t n)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need(name, "name");
		need(grad, "gradient");
		dev.write_grad(name, grad, n);
		return 0;
	});
}

int ckpt_commit(ckpt_device *d, const void *blob, size_t blob_len)
{
	return with_device(d, [&](ckpt::Device &dev) {
		if (blob_len)
			need(blob, "blob");
		auto r = dev.commit({static_cast<const uint8_t *>(blob), blob_len});
		return r == ckpt::CommitResult::committed ? CKPT_COMMITTED : CKPT_OVERFLOW;
	});
}

int ckpt_abort(ckpt_device *d)
{
	return with_device(d, [&](ckpt::Device &dev) {
		dev.abort();
		return 0;
	});
}

int ckpt_read_params(ckpt_device *d, const char *name, uint16_t *out, uint64_t n)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need(name, "name");
		need(out, "out");
		dev.read_params(name, out, n);
		return 0;
	});
}

int ckpt_read_state(ckpt_device *d, const char *name, float *p, float *m, float *v, uint64_t n)
{
	return with_device(d, [&](ckpt::Device &dev) {
		need(name, "name");
		need(p, "p");
		need(m, "m");
		need(v, "v");
		dev.read_state(name, p, m, v, n);
		return 0;
	});
}

int ckpt_blob(ckpt_device *d, void *buf, size_t cap)
{
	return with_device(d, [&](ckpt::Device &dev) {
		const struct ckpt_status st = dev.status();
		if (cap) {
			need(buf, "buf");
			std::memcpy(buf, st.blob, std::min<size_t>(cap, st.blob_len));
		}
		return static_cast<int>(st.blob_len);
	});
}

} // extern "C"
