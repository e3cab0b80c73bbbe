# NetReduce: QSFP28 cages of the {{ board }} shell (pins and standards come from the platform).
# Template: rendered per build by netreduce.hw.boards.shell (Jinja2).
#
# The sideband signals (ModSelL, ResetL, LPMode out; ModPrsL, IntL in) are static levels or slow
# status: no timing relationship with any clock.
{% for p in ports %}
# cage {{ p.cage }}
set_false_path -to [get_ports { {{- p.sideband_out | join(' ') -}} }]
set_output_delay 0 [get_ports { {{- p.sideband_out | join(' ') -}} }]
set_false_path -from [get_ports { {{- p.sideband_in | join(' ') -}} }]
set_input_delay 0 [get_ports { {{- p.sideband_in | join(' ') -}} }]
{% endfor %}
