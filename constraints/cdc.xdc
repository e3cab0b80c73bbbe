# NetReduce: clock-domain crossings and false paths of the {{ board }} shell.
# Template: rendered per build by netreduce.hw.boards.shell (Jinja2).
#
# Clock domains: sys (board 125 MHz, {{ sys_clock_port }}), core (250 MHz, generated from sys by the
# core_clock MMCM: Vivado derives it, and it stays in the sys group, related to sys) and one MAC
# clock per cage in use. Sys/core and the MAC clocks come from different oscillators, so they
# are asynchronous. Every signal that crosses between
# them goes through an Amaranth synchroniser (FFSynchronizer / ResetSynchronizer, with
# ASYNC_REG; the build's Tcl adds their false paths) or an AsyncFIFO (Gray-coded pointers through
# the same synchronisers, data read only after its pointer has crossed).
set_clock_groups -asynchronous \
    -group [get_clocks -include_generated_clocks -of_objects [get_ports {{ sys_clock_port }}]]{% for p in ports %} \
    -group [get_clocks -of_objects [get_pins {{ p.mac_clock_pin }}]]{% endfor %}


# Reset button: asynchronous input, synchronised on chip.
set_false_path -from [get_ports {{ reset_port }}]
set_input_delay 0 [get_ports {{ reset_port }}]

# Status LEDs: static outputs.
{% if leds %}
set_false_path -to [get_ports { {{- leds | join(' ') -}} }]
set_output_delay 0 [get_ports { {{- leds | join(' ') -}} }]
{% endif %}
