// SPDX-License-Identifier: MIT
// The control-block command decoder (ckpt_cmd_decode, ckpt_codec.c), as a
// target meets a write to the control block, and the hyperparameter check
// BEGIN runs on what it decoded.
//
// Input: a flags byte, then the write (at most 4 KiB). Flag 1 seals the
// command's checksum over its length field's bytes first, so that mutations
// reach the checks behind the crc.
#include "fuzz_util.hpp"

extern "C" {
#include "ckpt_codec.h"
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > 1 + CKPT_BLOCK)
		return 0;
	std::vector<uint8_t> buf(data + 1, data + size);
	const uint32_t len = static_cast<uint32_t>(buf.size());
	if ((data[0] & 1) && len >= sizeof(ckpt_cmd_disk)) {
		uint32_t length;
		std::memcpy(&length, buf.data() + 16, 4);
		if (length >= 12 && length <= len) {
			std::memset(buf.data() + 8, 0, 4);
			const uint32_t crc = ckpt_crc32c(buf.data(), length);
			std::memcpy(buf.data() + 8, &crc, 4);
		}
	}

	static ckpt_cmd cmd, again;
	const int r = ckpt_cmd_decode(buf.data(), len, &cmd);
	FUZZ_ASSERT(r <= 0);
	if (r)
		return 0;
	switch (cmd.opcode) {
	case CKPT_OP_BEGIN:
		FUZZ_ASSERT(cmd.n_groups >= 1 && cmd.n_groups <= CKPT_MAX_GROUPS);
		for (uint32_t i = 0; i < cmd.n_groups; i++) {
			const char *field = nullptr;
			if (ckpt_hparams_check(&cmd.groups[i], &field))
				FUZZ_ASSERT(field != nullptr);
		}
		break;
	case CKPT_OP_COMMIT:
		FUZZ_ASSERT(cmd.blob_len <= CKPT_BLOB_MAX);
		break;
	case CKPT_OP_RANGE:
		FUZZ_ASSERT(cmd.n_ranges >= 1 && cmd.n_ranges <= CKPT_MAX_RANGES);
		break;
	case CKPT_OP_ABORT:
	case CKPT_OP_ROLLBACK:
		break;
	default:
		FUZZ_ASSERT(!"unknown opcode decoded");
	}

	// What was decoded encodes to a command that decodes the same.
	static uint8_t block[CKPT_BLOCK];
	const int n = ckpt_cmd_encode(&cmd, block);
	FUZZ_ASSERT(n >= static_cast<int>(sizeof(ckpt_cmd_disk)) && n <= static_cast<int>(CKPT_BLOCK));
	FUZZ_ASSERT(ckpt_cmd_decode(block, static_cast<uint32_t>(n), &again) == 0);
	FUZZ_ASSERT(again.opcode == cmd.opcode && again.step == cmd.step &&
		    again.n_groups == cmd.n_groups && again.blob_len == cmd.blob_len);
	FUZZ_ASSERT(std::memcmp(again.groups, cmd.groups, sizeof(cmd.groups)) == 0);
	FUZZ_ASSERT(std::memcmp(again.blob, cmd.blob, sizeof(cmd.blob)) == 0);
	return 0;
}
