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
	std::vector<std::string> hosts;	// the host NQNs allowed to connect
	bool any_host = false;		// any host may connect (no hosts named, no keys)
	bool no_auth = false;		// named hosts, without DH-HMAC-CHAP keys
	std::string key_file;		// "HOSTNQN HOST_KEY CTRL_KEY" lines; else keys are made
	bool json = false;
};
int cmd_serve(const ServeArgs &a);
// NQN or the dm name of a served device.
int cmd_unserve(const std::string &what);

} // namespace ckptctl
