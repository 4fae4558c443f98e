// SPDX-License-Identifier: MIT
// ckptctl serve / unserve: a dm-ckpt device exported through the kernel's
// NVMe-oF target (nvmet), set up in configfs.
#pragma once

#include <string>
#include <vector>

namespace ckptctl {

struct ServeArgs {
	std::string device;	// NAME or /dev/mapper/NAME
	std::string nqn, addr, transport = "tcp";
	std::vector<std::string> hosts;	// allowed host NQNs; none: any host
	bool json = false;
};
int cmd_serve(const ServeArgs &a);
// NQN or the dm name of a served device.
int cmd_unserve(const std::string &what);

} // namespace ckptctl
