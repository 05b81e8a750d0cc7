variable "pool_name" {
  description = "Name of the broker pool these agents serve; tagged as broker-pool."
  type        = string
}

variable "offer_id" {
  description = "The broker offer the instances stand for (cloud/zone/instance-type/tier), passed to `broker agent --offer`."
  type        = string
}

variable "availability_zone_id" {
  description = "AWS availability zone ID (for example use1-az1), as the price catalog names zones."
  type        = string
}

variable "instance_type" {
  description = "GPU instance type, for example g6.xlarge or p4d.24xlarge."
  type        = string
}

variable "instance_count" {
  description = "How many instances (agents) to run."
  type        = number
  default     = 1
}

variable "tier" {
  description = "Capacity tier: spot or on_demand; tagged as broker-tier."
  type        = string
  default     = "spot"

  validation {
    condition     = contains(["spot", "on_demand"], var.tier)
    error_message = "tier must be spot or on_demand."
  }
}

variable "max_price" {
  description = "Highest spot price in USD per hour; null caps it at the on-demand price."
  type        = number
  default     = null
}

variable "ami_id" {
  description = "A GPU AMI with NVIDIA drivers, Python 3.11 and the AWS CLI (for example an AWS Deep Learning AMI)."
  type        = string
}

variable "subnet_id" {
  description = "Subnet for the instances; null uses the default subnet of the availability zone."
  type        = string
  default     = null
}

variable "root_volume_gb" {
  description = "Size of the encrypted root volume in GB."
  type        = number
  default     = 200
}

variable "checkpoint_bucket" {
  description = "S3 bucket holding checkpoints."
  type        = string
}

variable "checkpoint_prefix" {
  description = "Key prefix inside the bucket; the instances may touch nothing else."
  type        = string
  default     = "broker/checkpoints/"
}

variable "redis_url" {
  description = "Broker Redis URL without a password, for example rediss://pool-NAME@broker.example.com:6380/0 (the pool's own user: `broker acl agent --pool NAME`); the agent adds the token."
  type        = string
}

variable "agent_token_secret_arn" {
  description = "ARN of the Secrets Manager secret holding the agent token (the Redis password); read at boot, never put in user data."
  type        = string
}

variable "broker_package_url" {
  description = "Where pip gets broker on the instance: a wheel URL (build one with `pip wheel --no-deps . -w dist` and upload it) or git+https://HOST/ORG/broker@TAG. The PyPI project named broker is another one."
  type        = string
}

variable "key_prefix" {
  description = "BROKER_PREFIX: the broker's key prefix in Redis (`broker agents provision` writes the broker's own); an agent opens the store as the broker does, or it registers where no server plans."
  type        = string
  default     = "broker:"
  validation {
    condition     = can(regex("^[A-Za-z0-9:._-]*$", var.key_prefix))
    error_message = "key_prefix: letters, digits, ':', '.', '_' or '-' only."
  }
}

variable "shards" {
  description = "BROKER_SHARDS: the broker's shard count (`broker agents provision` writes the broker's own); an agent opens the store as the broker does, or it registers where no server plans."
  type        = number
  default     = 1
  validation {
    condition     = var.shards >= 1 && floor(var.shards) == var.shards
    error_message = "shards: a whole number of at least 1."
  }
}

variable "registration_token" {
  description = "The pool's registration token (`broker agents provision` issues it when BROKER_AGENT_SECRET is set): it admits agents named <pool_name>.<host>; once it ends, new instances register with the pool's token the broker renews while any of the pool's agents runs; null when the broker asks for none."
  type        = string
  default     = null
  sensitive   = true
}

variable "tags" {
  description = "Extra tags for every resource."
  type        = map(string)
  default     = {}
}
