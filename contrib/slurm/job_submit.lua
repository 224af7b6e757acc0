-- tierstack slurm install: job_submit/lua script for SLURM (slurm.conf: JobSubmitPlugins=lua),
-- written by `tierstack slurm install`. SLURM 22.05's burst_buffer/lua copies the text of
-- `sbatch --bb "..."` into the job script as it is, and only lines that start with #BB_LUA
-- count: `--bb "pool=tierstack capacity=1G"` would become a shell line and the job would run
-- without a buffer. This adds the #BB_LUA to every line of --bb that lacks it, so that
-- `--bb "pool=tierstack capacity=1G stage_in=..."` works like the same #BB_LUA line.
-- A site with a job_submit.lua of its own merges slurm_job_submit's first lines into it.

local function with_directive(bb)
	local out = {}
	for line in string.gmatch(bb, "[^\n]+") do
		if string.find(line, "%S") then
			if string.match(line, "^%s*#") then
				table.insert(out, line)
			else
				table.insert(out, "#BB_LUA " .. string.gsub(line, "^%s+", ""))
			end
		end
	end
	return table.concat(out, "\n")
end

function slurm_job_submit(job_desc, part_list, submit_uid)
	local bb = job_desc.burst_buffer
	if bb ~= nil and bb ~= "" then
		job_desc.burst_buffer = with_directive(bb)
	end
	return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	return slurm.SUCCESS
end
