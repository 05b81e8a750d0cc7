# One A100 spot agent (Standard_NC24ads_A100_v4) in eastus, checkpoints in a blob container.
provider "azurerm" {
  features {}
}

module "agents" {
  source = "../../modules/agent-azure"

  pool_name               = "azure-eastus-nc24ads-a100-v4-spot"
  offer_id                = "azure/eastus/Standard_NC24ads_A100_v4/spot"
  resource_group_name     = "ml-agents"
  location                = "eastus"
  vm_size                 = "Standard_NC24ads_A100_v4"
  instance_count          = 1
  tier                    = "spot"
  max_bid_price           = -1
  subnet_id               = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/ml-net/providers/Microsoft.Network/virtualNetworks/ml/subnets/agents"
  admin_ssh_public_key    = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExampleKeyOnlyForTheExample broker@example"
  checkpoint_container_id = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/ml-data/providers/Microsoft.Storage/storageAccounts/acmeml/blobServices/default/containers/checkpoints"
  checkpoint_url          = "az://checkpoints/broker/"
  storage_account_name    = "acmeml"
  redis_url               = "rediss://agent@broker.internal.example.com:6380/0"
  broker_package_url      = "https://acme-ml-artifacts.s3.amazonaws.com/wheels/broker-0.1.0-py3-none-any.whl" # `pip wheel --no-deps . -w dist`, uploaded
  agent_token_secret_id   = "https://acme-ml.vault.azure.net/secrets/broker-agent-token"
  key_vault_id            = "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/ml-sec/providers/Microsoft.KeyVault/vaults/acme-ml"
}

output "vm_ids" {
  value = module.agents.vm_ids
}
