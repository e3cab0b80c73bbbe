# NetReduce: clocks of the {{ board }} shell.
# Template: rendered per build by netreduce.hw.boards.shell (Jinja2).
#
# * sys: the board's 125 MHz oscillator ({{ sys_clock_port }}); Amaranth writes its create_clock
#   from the platform resource's Clock() into the top-level XDC.
# * GT reference clocks: one per QSFP28 cage in use, at the frequency the board delivers (see the
#   platform file). The {{ ip }} IP's own XDC may create the same clock on its gt_ref_clk_p pin;
#   this user constraint is read after it (same period), so the board fact is what is timed.
# * MAC clocks (gt_txusrclk2, {{ mac_hz }} Hz): derived by Vivado from the reference clock through
#   the transceiver; cdc.xdc refers to them through the CMAC instance's pin.
# * core ({{ core_hz }} Hz): the core_clock MMCM's CLKOUT0, derived by Vivado from sys.
{% for p in ports %}
create_clock -period {{ '%.3f' % p.refclk_period_ns }} -name qsfp{{ p.cage }}_refclk [get_ports {{ p.refclk_port }}]
{% endfor %}
