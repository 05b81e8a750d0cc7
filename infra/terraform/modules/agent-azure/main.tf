locals {
  spot = var.tier == "spot"
  tags = merge(var.tags, { "broker-pool" = var.pool_name, "broker-tier" = var.tier })

  user_data = templatefile("${path.module}/templates/cloud-init.yaml.tftpl", {
    pool_name          = var.pool_name
    offer_id           = var.offer_id
    tier               = var.tier
    redis_url          = var.redis_url
    secret_id          = var.agent_token_secret_id
    client_id          = azurerm_user_assigned_identity.agent.client_id
    checkpoints        = var.checkpoint_url
    storage            = var.storage_account_name
    broker_package_url = var.broker_package_url
    registration_token = var.registration_token == null ? "" : var.registration_token
    key_prefix         = var.key_prefix
    shards             = var.shards
  })
}

resource "azurerm_user_assigned_identity" "agent" {
  name                = "broker-${var.pool_name}"
  resource_group_name = var.resource_group_name
  location            = var.location
  tags                = local.tags
}

# Data access to the checkpoint container alone.
resource "azurerm_role_assignment" "checkpoints" {
  scope                = var.checkpoint_container_id
  role_definition_name = "Storage Blob Data Contributor"
  principal_id         = azurerm_user_assigned_identity.agent.principal_id
}

resource "azurerm_role_assignment" "token" {
  scope                = var.key_vault_id
  role_definition_name = "Key Vault Secrets User"
  principal_id         = azurerm_user_assigned_identity.agent.principal_id
}

# No security_rule: nothing inbound is allowed beyond Azure's defaults for the virtual network.
resource "azurerm_network_security_group" "agent" {
  name                = "broker-${var.pool_name}"
  resource_group_name = var.resource_group_name
  location            = var.location
  tags                = local.tags
}

resource "azurerm_network_interface" "agent" {
  count               = var.instance_count
  name                = "broker-${var.pool_name}-${count.index}"
  resource_group_name = var.resource_group_name
  location            = var.location
  tags                = local.tags

  ip_configuration {
    name                          = "primary"
    subnet_id                     = var.subnet_id
    private_ip_address_allocation = "Dynamic"
  }
}

resource "azurerm_network_interface_security_group_association" "agent" {
  count                     = var.instance_count
  network_interface_id      = azurerm_network_interface.agent[count.index].id
  network_security_group_id = azurerm_network_security_group.agent.id
}

resource "azurerm_linux_virtual_machine" "agent" {
  count                           = var.instance_count
  name                            = "broker-${var.pool_name}-${count.index}"
  resource_group_name             = var.resource_group_name
  location                        = var.location
  size                            = var.vm_size
  admin_username                  = var.admin_username
  disable_password_authentication = true
  network_interface_ids           = [azurerm_network_interface.agent[count.index].id]
  custom_data                     = base64encode(local.user_data)
  tags                            = local.tags

  # Spot VMs are deleted on eviction; max_bid_price -1 pays up to the on-demand price.
  priority        = local.spot ? "Spot" : "Regular"
  eviction_policy = local.spot ? "Delete" : null
  max_bid_price   = local.spot ? var.max_bid_price : null

  admin_ssh_key {
    username   = var.admin_username
    public_key = var.admin_ssh_public_key
  }

  identity {
    type         = "UserAssigned"
    identity_ids = [azurerm_user_assigned_identity.agent.id]
  }

  os_disk {
    caching              = "ReadWrite"
    storage_account_type = "Premium_LRS"
    disk_size_gb         = var.os_disk_gb
  }

  source_image_reference {
    publisher = var.image.publisher
    offer     = var.image.offer
    sku       = var.image.sku
    version   = var.image.version
  }

  depends_on = [azurerm_role_assignment.token, azurerm_role_assignment.checkpoints]
}
