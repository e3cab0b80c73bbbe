"""CMAC IP configuration: only documented keys, consistent GT placement, Tcl that says so."""

import re

import pytest
from netreduce.hw.boards.cmac import (
    CMAC_US_KEYS,
    CMAC_USPLUS_KEYS,
    cmac_config,
    ip_tcl,
    validate_config,
)
from netreduce.hw.boards.vcu108 import VCU108Platform
from netreduce.hw.boards.vcu118 import VCU118Platform


def test_usplus_config_of_vcu118_cages():
    p = VCU118Platform()
    for cage, site in ((0, "CMACE4_X0Y7"), (1, "CMACE4_X0Y8")):
        cfg = cmac_config("cmac_usplus", p.cage(cage))
        assert cfg["CMAC_CORE_SELECT"] == site
        assert cfg["USER_INTERFACE"] == "AXIS" and cfg["NUM_LANES"] == "4x25"
        assert cfg["GT_REF_CLK_FREQ"] == "156.25" and cfg["GT_DRP_CLK"] == "125"
        assert cfg["INCLUDE_RS_FEC"] == "1"
        assert set(cfg) <= CMAC_USPLUS_KEYS


def test_us_config_of_vcu108_cage():
    cfg = cmac_config("cmac", VCU108Platform().cage(0))
    assert set(cfg) <= CMAC_US_KEYS
    assert cfg["GT_GROUP_SELECT"] == "X0Y12~X0Y15" and cfg["LANE4_GT_LOC"] == "X0Y15"
    assert cfg["GT_REF_CLK_FREQ"] == "161.1328125" and cfg["INCLUDE_RS_FEC"] == "0"
    assert "USER_INTERFACE" not in cfg   # LBUS only: the key is not one this IP is known to have
    assert cmac_config("cmac", VCU108Platform().cage(0), rs_fec=True)["INCLUDE_RS_FEC"] == "1"


def test_tcl_round_trip():
    cfg = cmac_config("cmac_usplus", VCU118Platform().cage(1))
    tcl = ip_tcl("cmac_usplus", "cmac_port1", cfg)
    assert re.search(r"^create_ip -name cmac_usplus -vendor xilinx.com -library ip "
                     r"-module_name cmac_port1 -dir ip$", tcl, re.M)
    assert dict(re.findall(r"CONFIG\.(\w+) \{([^}]*)\}", tcl)) == cfg
    assert tcl.rstrip().endswith("[get_ips cmac_port1]")


@pytest.mark.parametrize("change,msg", [
    ({"NOT_A_KEY": "1"}, "not parameters of the IP"),
    ({"CMAC_CORE_SELECT": "CMAC_SITE_X0Y0"}, "not a site name"),
    ({"GT_GROUP_SELECT": "X1Y48-X1Y51"}, "GT_GROUP_SELECT"),
    ({"LANE3_GT_LOC": "X1Y49"}, "do not match"),
    ({"GT_REF_CLK_FREQ": "156.25 ; exec rm"}, "plain Tcl word"),
])
def test_validate_rejects(change, msg):
    cfg = dict(cmac_config("cmac_usplus", VCU118Platform().cage(0)), **change)
    with pytest.raises(ValueError, match=msg):
        validate_config("cmac_usplus", cfg)


def test_us_key_set_rejects_usplus_only_keys():
    cfg = cmac_config("cmac", VCU108Platform().cage(0))
    cfg["USER_INTERFACE"] = "AXIS"
    with pytest.raises(ValueError, match="USER_INTERFACE"):
        validate_config("cmac", cfg)


def test_unknown_ip():
    with pytest.raises(ValueError, match="unknown CMAC IP"):
        cmac_config("cmac_versal", VCU118Platform().cage(0))
