"""Autoscaling on token throughput with p99 latency as a guard (docs/autoscaling.md).

`policy` holds the decision as a pure function, `signals` measures the fleet, `state` keeps the
policy's memory in the resource's status, `autoscaler` is the task (started by the operator's
startup handler) that ties them together, and `simulator` replays load traces against the policy.
"""
