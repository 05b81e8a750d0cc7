variable "pool_name" {
  description = "Name of the broker pool these agents serve; tagged broker-pool."
  type        = string
}

variable "offer_id" {
  description = "The broker offer the VMs stand for (cloud/region/size/tier), passed to `broker agent --offer`."
  type        = string
}

variable "resource_group_name" {
  description = "Resource group for the agents' resources."
  type        = string
}

variable "location" {
  description = "Azure region, for example eastus."
  type        = string
}

variable "vm_size" {
  description = "NC or ND GPU size, for example Standard_NC24ads_A100_v4."
  type        = string

  validation {
    condition     = can(regex("^Standard_N[CDV]", var.vm_size))
    error_message = "vm_size must be a GPU size (Standard_NC..., Standard_ND..., Standard_NV...)."
  }
}

variable "instance_count" {
  description = "How many VMs (agents) to run."
  type        = number
  default     = 1
}

variable "tier" {
  description = "Capacity tier: spot or on_demand; tagged broker-tier."
  type        = string
  default     = "spot"

  validation {
    condition     = contains(["spot", "on_demand"], var.tier)
    error_message = "tier must be spot or on_demand."
  }
}

variable "max_bid_price" {
  description = "Highest spot price in USD per hour; -1 pays up to the on-demand price and is never evicted for price."
  type        = number
  default     = -1
}

variable "subnet_id" {
  description = "Subnet for the VMs' network interfaces."
  type        = string
}

variable "admin_username" {
  description = "Admin user of the VMs (SSH keys only; no inbound rule lets SSH in)."
  type        = string
  default     = "broker"
}

variable "admin_ssh_public_key" {
  description = "SSH public key for the admin user."
  type        = string
}

variable "image" {
  description = "Marketplace image with NVIDIA drivers, Python 3.11 and cloud-init."
  type = object({
    publisher = string
    offer     = string
    sku       = string
    version   = string
  })
  default = {
    publisher = "microsoft-dsvm"
    offer     = "ubuntu-hpc"
    sku       = "2204"
    version   = "latest"
  }
}

variable "os_disk_gb" {
  description = "OS disk size in GB."
  type        = number
  default     = 200
}

variable "checkpoint_container_id" {
  description = "Resource ID of the blob container holding checkpoints; the identity gets data access to it alone."
  type        = string
}

variable "checkpoint_url" {
  description = "fsspec URL of the checkpoint location, for example az://checkpoints/broker/ (account in the env)."
  type        = string
}

variable "storage_account_name" {
  description = "Storage account of the checkpoint container."
  type        = string
}

variable "redis_url" {
  description = "Broker Redis URL without a password, for example rediss://pool-NAME@broker.example.com:6380/0 (the pool's own user: `broker acl agent --pool NAME`); the agent adds the token."
  type        = string
}

variable "agent_token_secret_id" {
  description = "Versionless ID of the Key Vault secret holding the agent token (https://VAULT.vault.azure.net/secrets/NAME); read at boot, never put in custom data."
  type        = string
}

variable "key_vault_id" {
  description = "Resource ID of the Key Vault holding the token secret (scope of the identity's read access)."
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
