# One L4 spot agent (g2-standard-4) in us-central1-a, checkpoints in Cloud Storage.
provider "google" {
  project = "acme-ml"
}

module "agents" {
  source = "../../modules/agent-gcp"

  pool_name             = "gcp-us-central1-a-g2-standard-4-spot"
  offer_id              = "gcp/us-central1-a/g2-standard-4/spot"
  project               = "acme-ml"
  zone                  = "us-central1-a"
  machine_type          = "g2-standard-4"
  instance_count        = 1
  tier                  = "spot"
  image                 = "projects/deeplearning-platform-release/global/images/family/common-cu124-ubuntu-2204-py310"
  checkpoint_bucket     = "acme-ml-checkpoints"
  checkpoint_prefix     = "broker/checkpoints/"
  redis_url             = "rediss://agent@broker.internal.example.com:6380/0"
  broker_package_url    = "https://acme-ml-artifacts.s3.amazonaws.com/wheels/broker-0.1.0-py3-none-any.whl" # `pip wheel --no-deps . -w dist`, uploaded
  agent_token_secret_id = "broker-agent-token"
}

output "instance_names" {
  value = module.agents.instance_names
}
