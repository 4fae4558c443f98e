// SPDX-License-Identifier: MIT
// The kernel target's table line (ckpt_table_parse, ckpt_table.c), split at
// blanks as device-mapper splits a table line into argv.
#include <cctype>
#include <string>

#include "fuzz_util.hpp"

extern "C" {
#include "ckpt_table.h"
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > 4096)
		return 0;
	// Every word its own allocation, so ASan sees a read past its NUL.
	std::vector<std::string> words;
	std::string w;
	for (size_t i = 0; i <= size; i++) {
		if (i == size || std::isspace(data[i]) || !data[i]) {
			if (!w.empty())
				words.push_back(w);
			w.clear();
		} else {
			w += static_cast<char>(data[i]);
		}
	}
	std::vector<char *> argv;
	std::vector<std::unique_ptr<char[]>> store;
	for (const std::string &s : words) {
		store.emplace_back(new char[s.size() + 1]);
		std::memcpy(store.back().get(), s.c_str(), s.size() + 1);
		argv.push_back(store.back().get());
	}

	ckpt_table_args a;
	std::memset(&a, 0xa5, sizeof(a));
	const ckpt_table_args before = a;
	const char *err = nullptr;
	const int r = ckpt_table_parse(static_cast<uint32_t>(argv.size()), argv.data(), &a, &err);
	if (r) {
		FUZZ_ASSERT(r == -CKPT_E_INVAL);
		FUZZ_ASSERT(err && *err);
		FUZZ_ASSERT(std::memcmp(&a, &before, sizeof(a)) == 0);
		return 0;
	}
	FUZZ_ASSERT(!argv.empty() && a.dev == argv[0]);
	FUZZ_ASSERT(a.queue_depth >= 1 && a.queue_depth <= CKPT_MAX_QUEUE_DEPTH);
	FUZZ_ASSERT(a.staging_kb >= 1 && a.staging_kb <= CKPT_MAX_STAGING_KB);
	FUZZ_ASSERT(a.n_opts <= CKPT_TABLE_OPTS_N);
	FUZZ_ASSERT(argv.size() == 1 || argv.size() == 2 + 2 * a.n_opts);
	for (uint32_t i = 0; i < a.n_opts; i++) {
		FUZZ_ASSERT(a.order[i] < CKPT_TABLE_OPTS_N);
		FUZZ_ASSERT(ckpt_table_opt_name(a.order[i]) != nullptr);
		for (uint32_t j = 0; j < i; j++)
			FUZZ_ASSERT(a.order[i] != a.order[j]);
	}
	return 0;
}
