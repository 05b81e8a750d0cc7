variable "pool_name" {
  description = "Name of the broker pool these agents serve; labelled broker-pool (lowercase letters, digits, dashes)."
  type        = string
}

variable "offer_id" {
  description = "The broker offer the instances stand for (cloud/zone/instance-type/tier), passed to `broker agent --offer`."
  type        = string
}

variable "project" {
  description = "GCP project ID."
  type        = string
}

variable "zone" {
  description = "Zone, for example us-central1-a."
  type        = string
}

variable "machine_type" {
  description = "Machine type, for example g2-standard-4 or a2-highgpu-1g (their GPUs come with the machine type)."
  type        = string
}

variable "accelerator_type" {
  description = "Accelerator to attach to an N1 machine type (for example nvidia-tesla-t4); null for A2/A3/G2, whose GPUs are built in."
  type        = string
  default     = null
}

variable "accelerator_count" {
  description = "How many accelerators to attach (N1 machine types only)."
  type        = number
  default     = 0
}

variable "instance_count" {
  description = "How many instances (agents) to run."
  type        = number
  default     = 1
}

variable "tier" {
  description = "Capacity tier: spot or on_demand; labelled broker-tier."
  type        = string
  default     = "spot"

  validation {
    condition     = contains(["spot", "on_demand"], var.tier)
    error_message = "tier must be spot or on_demand."
  }
}

variable "image" {
  description = "Boot image with NVIDIA drivers, Python 3.11, cloud-init and gcloud (for example a Deep Learning VM image)."
  type        = string
}

variable "boot_disk_gb" {
  description = "Boot disk size in GB."
  type        = number
  default     = 200
}

variable "network" {
  description = "VPC network."
  type        = string
  default     = "default"
}

variable "subnetwork" {
  description = "Subnetwork; null uses the network's subnetwork in the zone's region."
  type        = string
  default     = null
}

variable "checkpoint_bucket" {
  description = "Cloud Storage bucket holding checkpoints."
  type        = string
}

variable "checkpoint_prefix" {
  description = "Object prefix inside the bucket; the service account may touch nothing else."
  type        = string
  default     = "broker/checkpoints/"
}

variable "redis_url" {
  description = "Broker Redis URL without a password, for example rediss://pool-NAME@broker.example.com:6380/0 (the pool's own user: `broker acl agent --pool NAME`); the agent adds the token."
  type        = string
}

variable "agent_token_secret_id" {
  description = "Secret Manager secret ID holding the agent token (the Redis password); read at boot, never put in metadata."
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

variable "labels" {
  description = "Extra labels for the instances."
  type        = map(string)
  default     = {}
}
