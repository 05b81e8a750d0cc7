output "instance_ids" {
  description = "IDs of the agent instances."
  value       = aws_instance.agent[*].id
}

output "launch_template_id" {
  description = "ID of the launch template the instances use."
  value       = aws_launch_template.agent.id
}

output "security_group_id" {
  description = "ID of the egress-only security group."
  value       = aws_security_group.agent.id
}

output "iam_role_arn" {
  description = "ARN of the instances' role (checkpoint prefix and token secret only)."
  value       = aws_iam_role.agent.arn
}
