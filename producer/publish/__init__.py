"""Publish: events, processes, requests and metrics to Kafka.

    kafkasink   batched, lossless within a bound, dropped batches counted (KafkaSink)
    identity    who a process is (pod, SLURM job, command), for the processes topic
    redact      secrets out of command lines before they leave the node
    deadagents  what a node agent killed outright never published, counted by the next
"""
