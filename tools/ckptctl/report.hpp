// SPDX-License-Identifier: MIT
// Reports like lvm's (lvs -o): rows of named fields, printed as aligned
// columns under a heading, or joined by a separator for scripts.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ckptctl {

struct ReportArgs {
	std::string fields;	// -o: "a,b", "+c" adds to the defaults; empty: the defaults
	std::string separator;	// --separator: fields joined by it, not aligned
	bool noheadings = false;
	bool given() const { return !fields.empty() || !separator.empty() || noheadings; }
};

// The fields of a report of some kind: every one a row may have, and those
// shown by default.
struct ReportKind {
	std::vector<std::string> valid;
	std::string defaults;
};

// The fields -o selects; throws ckptctl::Error naming an unknown field and
// the valid ones.
std::vector<std::string> report_fields(const ReportKind &kind, const std::string &spec);
// Prints rows (JSON objects); a field a row lacks shows as '-'.
void print_report(const std::vector<nlohmann::json> &rows, const std::vector<std::string> &fields,
		  const ReportArgs &a);

} // namespace ckptctl
