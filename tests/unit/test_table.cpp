// SPDX-License-Identifier: MIT
// The kernel target's table line as the core parses it (ckpt_table.c): the
// constructor's arguments and errors, reachable without a VM.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

extern "C" {
#include "ckpt_table.h"
}

namespace {

// args.dev points into the argv the parser was given, which parse() owns
// only while it runs: dev keeps a copy.
struct Parsed {
	int ret;
	std::string error;
	ckpt_table_args args;
	std::string dev;
};

// The table line after "ckpt", split at blanks as dm_split_args does.
Parsed parse(const std::string &line)
{
	std::vector<std::string> words;
	std::istringstream in(line);
	for (std::string w; in >> w;)
		words.push_back(w);
	std::vector<char *> argv;
	for (std::string &w : words)
		argv.push_back(w.data());
	Parsed p{};
	const char *err = nullptr;
	p.ret = ckpt_table_parse(static_cast<uint32_t>(argv.size()), argv.data(), &p.args, &err);
	if (p.ret)
		p.error = err ? err : "(null)";
	else
		p.dev = p.args.dev;
	p.args.dev = nullptr;
	return p;
}

TEST(Table, DefaultsAndDevice)
{
	Parsed p = parse("/dev/nvme0n1");
	ASSERT_EQ(p.ret, 0) << p.error;
	EXPECT_EQ(p.dev, "/dev/nvme0n1");
	EXPECT_EQ(p.args.queue_depth, CKPT_DEFAULT_QUEUE_DEPTH);
	EXPECT_EQ(p.args.staging_kb, CKPT_DEFAULT_STAGING_KB);
	EXPECT_EQ(p.args.n_opts, 0u);
	p = parse("253:0 0");
	ASSERT_EQ(p.ret, 0) << p.error;
	EXPECT_EQ(p.args.n_opts, 0u);
}

TEST(Table, OptionsInTheOrderGiven)
{
	Parsed p = parse("/dev/x 4 staging_kb 64 QUEUE_DEPTH 3");
	ASSERT_EQ(p.ret, 0) << p.error;
	EXPECT_EQ(p.args.queue_depth, 3u);
	EXPECT_EQ(p.args.staging_kb, 64u);
	ASSERT_EQ(p.args.n_opts, 2u);
	EXPECT_EQ(p.args.order[0], static_cast<uint32_t>(CKPT_TABLE_STAGING_KB));
	EXPECT_EQ(p.args.order[1], static_cast<uint32_t>(CKPT_TABLE_QUEUE_DEPTH));
	EXPECT_STREQ(ckpt_table_opt_name(p.args.order[0]), "staging_kb");
	EXPECT_EQ(ckpt_table_opt_value(&p.args, CKPT_TABLE_STAGING_KB), 64u);
	EXPECT_EQ(ckpt_table_opt_value(&p.args, CKPT_TABLE_QUEUE_DEPTH), 3u);
	EXPECT_EQ(ckpt_table_opt_name(CKPT_TABLE_OPTS_N), nullptr);
	EXPECT_EQ(ckpt_table_opt_value(&p.args, CKPT_TABLE_OPTS_N), 0u);
	p = parse("/dev/x 2 queue_depth 128");
	ASSERT_EQ(p.ret, 0) << p.error;
	EXPECT_EQ(p.args.queue_depth, 128u);
	p = parse("/dev/x 2 staging_kb 4194304");
	ASSERT_EQ(p.ret, 0) << p.error;
	EXPECT_EQ(p.args.staging_kb, 4194304u);
}

// The constructor's refusals (tests/kmod/ctr_test.c runs the same lines in
// the VM), and the numbers the old kernel parsers let through by accident:
// a sign, a blank or a newline around a number, a count that wraps u32.
TEST(Table, Refusals)
{
	const struct {
		const char *line, *error;
	} cases[] = {
		{"", "Invalid argument count"},
		{"/dev/x x", "Invalid number of optional arguments"},
		{"/dev/x -2 queue_depth 2", "Invalid number of optional arguments"},
		{"/dev/x 6 queue_depth 2 staging_kb 8 queue_depth 2", "Invalid number of optional arguments"},
		{"/dev/x 2 queue_depth", "Invalid number of optional arguments"},
		{"/dev/x 4294967298 queue_depth 2", "Invalid number of optional arguments"},
		{"/dev/x +2 queue_depth 2", "Invalid number of optional arguments"},
		{"/dev/x 1 queue_depth", "queue_depth needs a value"},
		{"/dev/x 1 staging_kb", "staging_kb needs a value"},
		{"/dev/x 3 queue_depth 2 staging_kb", "staging_kb needs a value"},
		{"/dev/x 2 queue_depth 0", "queue_depth out of range"},
		{"/dev/x 2 queue_depth 129", "queue_depth out of range"},
		{"/dev/x 2 queue_depth abc", "Invalid queue_depth"},
		{"/dev/x 2 queue_depth -1", "Invalid queue_depth"},
		{"/dev/x 2 queue_depth +1", "Invalid queue_depth"},
		{"/dev/x 2 queue_depth 99999999999", "Invalid queue_depth"},
		{"/dev/x 2 queue_depth 4294967296", "Invalid queue_depth"},
		{"/dev/x 2 staging_kb 0", "staging_kb out of range"},
		{"/dev/x 2 staging_kb 4194305", "staging_kb out of range"},
		{"/dev/x 2 staging_kb 1k", "Invalid staging_kb"},
		{"/dev/x 2 stagingkb 8", "Unknown optional argument"},
		{"/dev/x 4 queue_depth 2 queue_depth 3", "Duplicate queue_depth"},
		{"/dev/x 4 staging_kb 8 staging_kb 8", "Duplicate staging_kb"},
		{"/dev/x 2 queue_depth 2 extra", "Too many arguments"},
		{"/dev/x 0 queue_depth 2", "Too many arguments"},
	};
	for (const auto &c : cases) {
		Parsed p = parse(c.line);
		EXPECT_EQ(p.ret, -CKPT_E_INVAL) << c.line;
		EXPECT_EQ(p.error.rfind(c.error, 0), 0u) << c.line << ": " << p.error;
	}
	// A number with a newline in it (a table line is split at blanks only
	// by dm, so the word can carry one).
	char dev[] = "/dev/x", two[] = "2", name[] = "queue_depth", nl[] = "4\n";
	char *argv[] = {dev, two, name, nl};
	ckpt_table_args a{};
	const char *err = nullptr;
	EXPECT_EQ(ckpt_table_parse(4, argv, &a, &err), -CKPT_E_INVAL);
	EXPECT_STREQ(err, "Invalid queue_depth (not a number)");
}

} // namespace
