#include "interfaces.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "myriad/util/error.h"

namespace myriad {

namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    // NCCL allows "name:port"; the port plays no part in choosing the interface.
    item = item.substr(0, item.find(':'));
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

// "10.0.0.0/8" holds `ipv4`; false for anything that is not an IPv4 CIDR subnet.
bool in_subnet(uint32_t ipv4, const std::string& cidr) {
  const size_t slash = cidr.find('/');
  if (slash == std::string::npos || ipv4 == 0) return false;
  in_addr net{};
  if (inet_pton(AF_INET, cidr.substr(0, slash).c_str(), &net) != 1) return false;
  int bits = 0;
  try {
    bits = std::stoi(cidr.substr(slash + 1));
  } catch (const std::exception&) {
    return false;
  }
  if (bits < 0 || bits > 32) return false;
  const uint32_t mask = bits == 0 ? 0 : ~uint32_t{0} << (32 - bits);
  return (ipv4 & mask) == (ntohl(net.s_addr) & mask);
}

// Open MPI's if_include/if_exclude entries: an interface name or an IPv4 subnet.
bool matches_mpi_entry(const NetInterface& i, const std::string& entry) {
  return entry.find('/') != std::string::npos ? in_subnet(i.ipv4, entry) : i.name == entry;
}

std::vector<NetInterface> select(const std::vector<NetInterface>& all, const std::string& list) {
  std::vector<NetInterface> chosen;
  for (const NetInterface& i : all) {
    if (matches_interface_list(i.name, list)) chosen.push_back(i);
  }
  return chosen;
}

}  // namespace

std::vector<NetInterface> list_interfaces() {
  ifaddrs* head = nullptr;
  MYRIAD_CHECK(getifaddrs(&head) == 0, "getifaddrs failed: {}", std::strerror(errno));
  std::vector<NetInterface> interfaces;
  for (const ifaddrs* a = head; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || (a->ifa_flags & IFF_UP) == 0) continue;
    const int family = a->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char text[INET6_ADDRSTRLEN] = {0};
    uint32_t ipv4 = 0;
    if (family == AF_INET) {
      const in_addr address = reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr;
      ipv4 = ntohl(address.s_addr);
      inet_ntop(AF_INET, &address, text, sizeof(text));
    } else {
      const in6_addr& address = reinterpret_cast<const sockaddr_in6*>(a->ifa_addr)->sin6_addr;
      // Link-local addresses reach no other subnet; NCCL skips them too.
      if (IN6_IS_ADDR_LINKLOCAL(&address)) continue;
      inet_ntop(AF_INET6, &address, text, sizeof(text));
    }
    bool known = false;
    for (NetInterface& i : interfaces) {
      if (i.name != a->ifa_name) continue;
      known = true;
      if (i.ipv4 == 0 && ipv4 != 0) {
        i.ipv4 = ipv4;
        i.address = text;
      }
    }
    if (!known) {
      interfaces.push_back({a->ifa_name, text, ipv4, (a->ifa_flags & IFF_LOOPBACK) != 0});
    }
  }
  freeifaddrs(head);
  return interfaces;
}

int64_t link_speed_mbps(const std::string& name) {
  std::ifstream in("/sys/class/net/" + name + "/speed");
  int64_t speed = -1;
  if (!(in >> speed) || speed <= 0) return -1;
  return speed;
}

bool matches_interface_list(const std::string& name, const std::string& list) {
  std::string rest = list;
  const bool exclude = !rest.empty() && rest[0] == '^';
  if (exclude) rest.erase(0, 1);
  const bool exact = !rest.empty() && rest[0] == '=';
  if (exact) rest.erase(0, 1);
  bool listed = false;
  for (const std::string& entry : split_list(rest)) {
    if (exact ? name == entry : starts_with(name, entry)) listed = true;
  }
  return listed != exclude;
}

std::vector<NetInterface> nccl_interfaces(const std::vector<NetInterface>& all,
                                          const char* ifname) {
  if (ifname != nullptr) return select(all, ifname);
  for (const char* fallback : {"ib", "^docker,lo,virbr", "docker", "lo"}) {
    std::vector<NetInterface> chosen = select(all, fallback);
    if (!chosen.empty()) return chosen;
  }
  return {};
}

std::vector<NetInterface> mpi_interfaces(const std::vector<NetInterface>& all, const char* include,
                                         const char* exclude) {
  const bool including = include != nullptr;
  const std::vector<std::string> entries = split_list(including            ? include
                                                      : exclude != nullptr ? exclude
                                                                           : "127.0.0.1/8,sppp");
  std::vector<NetInterface> chosen;
  for (const NetInterface& i : all) {
    if (i.ipv4 == 0) continue;  // Open MPI's TCP transport is IPv4 unless built otherwise
    bool listed = false;
    for (const std::string& entry : entries) listed = listed || matches_mpi_entry(i, entry);
    if (listed == including) chosen.push_back(i);
  }
  return chosen;
}

bool is_host_local_interface(const std::string& name) {
  return name == "lo" || starts_with(name, "docker") || starts_with(name, "virbr") ||
         starts_with(name, "veth");
}

}  // namespace myriad
