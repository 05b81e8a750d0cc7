output "vm_ids" {
  description = "IDs of the agent VMs."
  value       = azurerm_linux_virtual_machine.agent[*].id
}

output "identity_principal_id" {
  description = "Principal of the agents' managed identity (checkpoint container and token secret only)."
  value       = azurerm_user_assigned_identity.agent.principal_id
}
