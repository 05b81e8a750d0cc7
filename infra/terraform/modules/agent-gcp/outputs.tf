output "instance_names" {
  description = "Names of the agent instances."
  value       = google_compute_instance.agent[*].name
}

output "service_account_email" {
  description = "The agents' service account (checkpoint prefix and token secret only)."
  value       = google_service_account.agent.email
}
