"""The BPF programs and their one header, shipped as package data (`gpuflight.producer.bpf`): the
producer loads them with importlib.resources, so an installed wheel needs no checkout."""
