// SPDX-License-Identifier: MIT
#include "report.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "fail.hpp"

using nlohmann::json;

namespace ckptctl {

namespace {

std::vector<std::string> split(const std::string &s)
{
	std::vector<std::string> out;
	size_t start = 0;
	for (size_t end; (end = s.find(',', start)) != std::string::npos; start = end + 1)
		out.push_back(s.substr(start, end - start));
	out.push_back(s.substr(start));
	return out;
}

std::string cell(const json &row, const std::string &field)
{
	auto it = row.find(field);
	if (it == row.end() || it->is_null())
		return "-";
	return it->is_string() ? it->get<std::string>() : it->dump();
}

} // namespace

std::vector<std::string> report_fields(const ReportKind &kind, const std::string &spec)
{
	std::vector<std::string> fields;
	std::string rest = spec;
	if (spec.empty() || spec[0] == '+') {
		fields = split(kind.defaults);
		rest = spec.empty() ? "" : spec.substr(1);
	}
	if (!spec.empty())
		for (const std::string &f : split(rest)) {
			if (std::find(kind.valid.begin(), kind.valid.end(), f) == kind.valid.end())
				fail(CKPT_E_INVAL, "unknown field '{}'; valid fields: {}", f,
				     fmt::join(kind.valid, ","));
			fields.push_back(f);
		}
	return fields;
}

void print_report(const std::vector<json> &rows, const std::vector<std::string> &fields, const ReportArgs &a)
{
	std::vector<std::vector<std::string>> lines;
	if (!a.noheadings)
		lines.push_back(fields);
	for (const json &r : rows) {
		lines.emplace_back();
		for (const std::string &f : fields)
			lines.back().push_back(cell(r, f));
	}
	std::vector<size_t> width(fields.size(), 0);
	for (const auto &l : lines)
		for (size_t i = 0; i < l.size(); i++)
			width[i] = std::max(width[i], l[i].size());
	for (const auto &l : lines) {
		std::string out;
		for (size_t i = 0; i < l.size(); i++) {
			if (!a.separator.empty())
				out += (i ? a.separator : "") + l[i];
			else if (i + 1 < l.size())
				out += fmt::format("{:<{}}  ", l[i], width[i]);
			else
				out += l[i];
		}
		fmt::print("{}\n", out);
	}
}

} // namespace ckptctl
