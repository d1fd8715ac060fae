#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace myriad {

// A network interface that is up and has an IPv4 or a global IPv6 address.
struct NetInterface {
  std::string name;
  std::string address;  // its first address, as text
  uint32_t ipv4 = 0;    // host byte order; 0 when it has none
  bool loopback = false;
};

// This host's interfaces, in the order getifaddrs lists them (the order NCCL and Open MPI take
// them in).
std::vector<NetInterface> list_interfaces();

// The link speed /sys/class/net/NAME/speed reports, in Mb/s; -1 when unknown (virtual links, a
// link that is down).
int64_t link_speed_mbps(const std::string& name);

// Whether `name` passes an NCCL_SOCKET_IFNAME-style list: comma-separated prefixes; a leading '^'
// turns the list into exclusions, a leading '=' (after any '^') makes every entry an exact name.
bool matches_interface_list(const std::string& name, const std::string& list);

// The interfaces NCCL's socket transport and bootstrap take: those NCCL_SOCKET_IFNAME
// (`ifname`, null when unset) selects; unset, ib* first, else anything but docker*, lo and
// virbr*, else docker*, else lo. NCCL's bootstrap uses the first.
std::vector<NetInterface> nccl_interfaces(const std::vector<NetInterface>& all, const char* ifname);

// The interfaces Open MPI's TCP transport takes: btl_tcp_if_include (`include`, names or IPv4
// CIDR subnets, null when unset), else all but btl_tcp_if_exclude (default 127.0.0.1/8).
std::vector<NetInterface> mpi_interfaces(const std::vector<NetInterface>& all, const char* include,
                                         const char* exclude);

// docker*, virbr*, veth*, lo: a bridge or loopback no other host reaches.
bool is_host_local_interface(const std::string& name);

}  // namespace myriad
