#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "apps/doctor/driver_version.h"
#include "apps/doctor/interfaces.h"

namespace myriad {
namespace {

std::vector<std::string> names(const std::vector<NetInterface>& interfaces) {
  std::vector<std::string> out;
  for (const NetInterface& i : interfaces) out.push_back(i.name);
  return out;
}

NetInterface ipv4(const std::string& name, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  NetInterface i;
  i.name = name;
  i.ipv4 = (a << 24) | (b << 16) | (c << 8) | d;
  i.address = std::to_string(a) + "." + std::to_string(b) + "." + std::to_string(c) + "." +
              std::to_string(d);
  i.loopback = name == "lo";
  return i;
}

using Names = std::vector<std::string>;

TEST(DoctorInterfaces, NcclSocketIfnameRules) {
  EXPECT_TRUE(matches_interface_list("eth0", "eth"));
  EXPECT_TRUE(matches_interface_list("ens1f0", "eth,ens"));
  EXPECT_FALSE(matches_interface_list("eth0", "^eth"));
  EXPECT_TRUE(matches_interface_list("ib0", "^eth,lo"));
  EXPECT_FALSE(matches_interface_list("eth0", "=eth"));
  EXPECT_TRUE(matches_interface_list("eth0", "=eth0"));
  EXPECT_FALSE(matches_interface_list("eth0", "^=eth0"));
  EXPECT_TRUE(matches_interface_list("eth01", "^=eth0"));
  EXPECT_TRUE(matches_interface_list("eth0", "eth0:12345"));  // a port plays no part
}

TEST(DoctorInterfaces, NcclDefaultPreference) {
  const NetInterface lo = ipv4("lo", 127, 0, 0, 1);
  const NetInterface docker = ipv4("docker0", 172, 17, 0, 1);
  const NetInterface virbr = ipv4("virbr0", 192, 168, 122, 1);
  const NetInterface eth = ipv4("eth0", 10, 0, 0, 2);
  const NetInterface ib = ipv4("ib0", 10, 1, 0, 2);
  EXPECT_EQ(names(nccl_interfaces({lo, docker, eth, ib}, nullptr)), Names{"ib0"});
  EXPECT_EQ(names(nccl_interfaces({lo, docker, virbr, eth}, nullptr)), Names{"eth0"});
  EXPECT_EQ(names(nccl_interfaces({lo, docker}, nullptr)), Names{"docker0"});
  EXPECT_EQ(names(nccl_interfaces({lo}, nullptr)), Names{"lo"});
  // NCCL_SOCKET_IFNAME wins, even when it names a bridge.
  EXPECT_EQ(names(nccl_interfaces({lo, docker, eth, ib}, "docker")), Names{"docker0"});
  EXPECT_EQ(names(nccl_interfaces({lo, docker, eth, ib}, "^lo,docker")), (Names{"eth0", "ib0"}));
  EXPECT_TRUE(nccl_interfaces({lo, eth}, "ens").empty());
}

TEST(DoctorInterfaces, OpenMpiIncludeAndExclude) {
  const NetInterface lo = ipv4("lo", 127, 0, 0, 1);
  const NetInterface docker = ipv4("docker0", 172, 17, 0, 1);
  const NetInterface eth = ipv4("eth0", 10, 0, 0, 2);
  NetInterface v6;
  v6.name = "eth1";
  v6.address = "2001:db8::1";
  EXPECT_EQ(names(mpi_interfaces({lo, docker, eth, v6}, nullptr, nullptr)),
            (Names{"docker0", "eth0"}));
  EXPECT_EQ(names(mpi_interfaces({lo, docker, eth}, "10.0.0.0/8", nullptr)), Names{"eth0"});
  EXPECT_EQ(names(mpi_interfaces({lo, docker, eth}, "docker0", nullptr)), Names{"docker0"});
  EXPECT_EQ(names(mpi_interfaces({lo, docker, eth}, nullptr, "lo,docker0")), Names{"eth0"});
  EXPECT_EQ(names(mpi_interfaces({lo, docker, eth}, nullptr, "127.0.0.0/8,172.16.0.0/12")),
            Names{"eth0"});
}

TEST(DoctorInterfaces, HostLocalNames) {
  EXPECT_TRUE(is_host_local_interface("docker0"));
  EXPECT_TRUE(is_host_local_interface("virbr0"));
  EXPECT_TRUE(is_host_local_interface("lo"));
  EXPECT_FALSE(is_host_local_interface("eth0"));
  EXPECT_FALSE(is_host_local_interface("ib0"));
}

// /proc/driver/nvidia/version as the proprietary and the open kernel modules write it: the
// version, not the word after "Kernel Module" (the open module's is "for").
TEST(DoctorDriverVersion, ReadsBothKernelModulesLines) {
  EXPECT_EQ(driver_version_from_proc(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 09:55:41 "
                "UTC 2025\nGCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n"),
            "580.95.05");
  EXPECT_EQ(driver_version_from_proc(
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release "
                "Build  (dvs-builder@U16-I3-B03-4-3)  Sun Jul 27 06:54:38 UTC 2025\nGCC version: "
                " gcc version 13.3.0\n"),
            "580.65.06");
  EXPECT_EQ(driver_version_from_proc("NVRM version: NVIDIA UNIX aarch64 Kernel Module  550.54.15\n"),
            "550.54.15");
  // No NVRM line, or none with a version: nothing, not a word of the line.
  EXPECT_EQ(driver_version_from_proc("GCC version:  gcc version 13.3.0\n"), "");
  EXPECT_EQ(driver_version_from_proc("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64\n"),
            "");
  EXPECT_EQ(driver_version_from_proc(""), "");
}

}  // namespace
}  // namespace myriad
