# Two L4 spot agents in us-east-1 (zone ID use1-az1), checkpoints in S3.
provider "aws" {
  region = "us-east-1"
}

module "agents" {
  source = "../../modules/agent-aws"

  pool_name              = "aws-use1-az1-g6-xlarge-spot"
  offer_id               = "aws/use1-az1/g6.xlarge/spot"
  availability_zone_id   = "use1-az1"
  instance_type          = "g6.xlarge"
  instance_count         = 2
  tier                   = "spot"
  max_price              = 0.8048
  ami_id                 = "ami-0123456789abcdef0" # an AWS Deep Learning AMI (GPU) in us-east-1
  checkpoint_bucket      = "acme-ml-checkpoints"
  checkpoint_prefix      = "broker/checkpoints/"
  redis_url              = "rediss://agent@broker.internal.example.com:6380/0"
  broker_package_url     = "https://acme-ml-artifacts.s3.amazonaws.com/wheels/broker-0.1.0-py3-none-any.whl" # `pip wheel --no-deps . -w dist`, uploaded
  agent_token_secret_arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:broker/agent-token-AbCdEf"
}

output "instance_ids" {
  value = module.agents.instance_ids
}
