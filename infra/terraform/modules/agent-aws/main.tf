locals {
  spot        = var.tier == "spot"
  tags        = merge(var.tags, { "broker-pool" = var.pool_name, "broker-tier" = var.tier })
  prefix_glob = "${trimsuffix(var.checkpoint_prefix, "/")}/*"
  subnet_id   = coalesce(var.subnet_id, try(data.aws_subnets.default.ids[0], null))

  user_data = templatefile("${path.module}/templates/cloud-init.yaml.tftpl", {
    pool_name          = var.pool_name
    offer_id           = var.offer_id
    tier               = var.tier
    redis_url          = var.redis_url
    secret_arn         = var.agent_token_secret_arn
    region             = element(split(":", var.agent_token_secret_arn), 3) # the secret's own region, not the instance's
    checkpoints        = "s3://${var.checkpoint_bucket}/${var.checkpoint_prefix}"
    broker_package_url = var.broker_package_url
    registration_token = var.registration_token == null ? "" : var.registration_token
    key_prefix         = var.key_prefix
    shards             = var.shards
  })
}


data "aws_subnets" "default" {
  filter {
    name   = "availability-zone-id"
    values = [var.availability_zone_id]
  }

  filter {
    name   = "default-for-az"
    values = ["true"]
  }
}

data "aws_subnet" "selected" {
  id = local.subnet_id
}

# Agents only dial out (to Redis, the checkpoint bucket, package mirrors): no inbound rule at all.
resource "aws_security_group" "agent" {
  name_prefix = "broker-${var.pool_name}-"
  description = "broker agents of pool ${var.pool_name}: egress only"
  vpc_id      = data.aws_subnet.selected.vpc_id

  egress {
    description      = "all outbound"
    from_port        = 0
    to_port          = 0
    protocol         = "-1"
    cidr_blocks      = ["0.0.0.0/0"]
    ipv6_cidr_blocks = ["::/0"]
  }

  tags = local.tags
}

resource "aws_iam_role" "agent" {
  name_prefix = "broker-${var.pool_name}-"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "ec2.amazonaws.com" }
      Action    = "sts:AssumeRole"
    }]
  })
  tags = local.tags
}

# Only the checkpoint prefix of the bucket, and only the agent token secret.
resource "aws_iam_role_policy" "agent" {
  name = "broker-agent"
  role = aws_iam_role.agent.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Effect   = "Allow"
        Action   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
        Resource = ["arn:aws:s3:::${var.checkpoint_bucket}/${local.prefix_glob}"]
      },
      {
        Effect    = "Allow"
        Action    = ["s3:ListBucket"]
        Resource  = ["arn:aws:s3:::${var.checkpoint_bucket}"]
        Condition = { StringLike = { "s3:prefix" = [local.prefix_glob] } }
      },
      {
        Effect   = "Allow"
        Action   = ["secretsmanager:GetSecretValue"]
        Resource = [var.agent_token_secret_arn]
      },
    ]
  })
}

resource "aws_iam_instance_profile" "agent" {
  name_prefix = "broker-${var.pool_name}-"
  role        = aws_iam_role.agent.name
  tags        = local.tags
}

resource "aws_launch_template" "agent" {
  name_prefix            = "broker-${var.pool_name}-"
  image_id               = var.ami_id
  instance_type          = var.instance_type
  user_data              = base64encode(local.user_data)
  vpc_security_group_ids = [aws_security_group.agent.id]

  iam_instance_profile {
    arn = aws_iam_instance_profile.agent.arn
  }

  # IMDSv2 only: the agent reads spot interruption notices through it with a session token.
  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  dynamic "instance_market_options" {
    for_each = local.spot ? [1] : []
    content {
      market_type = "spot"
      spot_options {
        spot_instance_type             = "one-time"
        instance_interruption_behavior = "terminate"
        max_price                      = var.max_price == null ? null : tostring(var.max_price)
      }
    }
  }

  block_device_mappings {
    device_name = "/dev/sda1"
    ebs {
      volume_size = var.root_volume_gb
      volume_type = "gp3"
      encrypted   = true
    }
  }

  tag_specifications {
    resource_type = "instance"
    tags          = local.tags
  }

  tags = local.tags
}

resource "aws_instance" "agent" {
  count     = var.instance_count
  subnet_id = local.subnet_id

  launch_template {
    id      = aws_launch_template.agent.id
    version = aws_launch_template.agent.latest_version
  }

  tags = merge(local.tags, { Name = "broker-${var.pool_name}-${count.index}" })
}
