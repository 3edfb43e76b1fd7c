"""Pure rendering: specs to the Kubernetes objects the operator applies, each object rendered in
one place. The reconciler only calls these and applies what they return.

  fleet.py           an EmbeddingDeployment's children, in apply order, and its ConfigMap
  workers.py         the worker Deployment and headless Service, the worker's settings
  gateway.py         a gateway's Deployment, Service, RBAC and settings: a fleet's own or shared
  shared_gateway.py  the fleets naming a shared gateway, and its objects
  monitoring.py      the ServiceMonitor
  pods.py            what every pod shares: security, resources, the model volume, Deployment
  config.py          settings as env vars, the config hash, where the model is
"""
