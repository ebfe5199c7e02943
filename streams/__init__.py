"""The stream worker: Kafka → windows per host and job → InfluxDB, and the reports read back.

Imports only gpuflight.producer.contract of the capture library. app.py wires Faust around
worker.Worker; the counting and window math (aggregate, windows, detect, requests, clock,
stored, measurements) imports no Faust; measurements.py is the InfluxDB contract Grafana
is generated from.
"""
