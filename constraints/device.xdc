# NetReduce: device configuration of {{ board }} ({{ part }}).
# Template: rendered per build by netreduce.hw.boards.shell (Jinja2: {{ '{{ }}' }} and {{ '{% %}' }}).
# The properties are those of the board's configuration flash; see the platform file for sources.
{% for name, value in bitstream_props %}
set_property {{ name }} {{ value }} [current_design]
{% endfor %}
